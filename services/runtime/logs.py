"""Logging, configured once in each entry point's main(); modules only get a named logger."""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the `fedasync` command calls `hold_back_library_noise` before any settings
    from fedasync.services.runtime.settings import LogSettings

#: libraries whose warnings say nothing is wrong, and the level they are held back to
LIBRARY_NOISE = {"absl": logging.ERROR}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def hold_back_library_noise() -> None:
    """Show the libraries' errors, not their routine warnings, in every entry point.

    dp-accounting (the privacy accountant, shared/privacy/accounting.py) warns through absl's
    logger for each fractional RDP order whose series fails to converge for a small noise
    multiplier ("_compute_log_a_frac failed to converge ... Excluding this order"): that order is
    left out (its RDP +inf, never the one chosen) and ε is right, yet a simulation with one DP arm
    prints dozens of such lines. The core does no logging, so the entry points quiet them here;
    absl's errors still show. Worker processes forked from an entry point inherit the levels.
    """
    for name, level in LIBRARY_NOISE.items():
        logging.getLogger(name).setLevel(level)


def configure(settings: LogSettings, service: str) -> None:
    hold_back_library_noise()
    handler = logging.StreamHandler(sys.stderr)
    if settings.json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
