"""A device's DP-SGD accountant kept in a file, so that a restarted worker goes on counting.

The accountant (learning/dpsgd.py) is the device's memory of every step it took: without it, a
worker restarted would report ε from 0 again while its samples had been trained on all along.
With FEDASYNC_WORKER__DPSGD_STATE set, the worker reads the file at start and writes it after
each run, before the run's update is sent (what is sent is then always counted). The file is
JSON, written to a temporary file and renamed over the old one, so a crash mid-write leaves the
previous state, never half of one. One file per device: two devices sharing one would add up.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from fedasync.learning.dpsgd import DeviceAccountant

#: the state file's format; a file of another is refused rather than misread
FORMAT = 1


class StateFileError(ValueError):
    """The state file exists but is not a DP-SGD accountant's state of this format."""


def load(path: Path, accountant: DeviceAccountant) -> None:
    """Restore `accountant` from `path` if it exists (a device's first start: nothing to read)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateFileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        data: Any = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        history = [(float(s), float(q), int(n)) for s, q, n in data["history"]]
        runs = int(data["runs"])
        if runs < 0 or any(
            not (math.isfinite(s) and s > 0 and 0 < q <= 1 and n > 0) for s, q, n in history
        ):
            raise ValueError("a step that no run takes (σ ≤ 0, q outside (0, 1], or no steps)")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateFileError(f"{path}: not a DP-SGD accountant's state: {exc}") from None
    accountant.restore(history, runs)


def save(path: Path, accountant: DeviceAccountant) -> None:
    """Write the accountant's state to `path`, atomically (rename over the previous one)."""
    data = {
        "format": FORMAT,
        "runs": accountant.runs,
        "history": [list(step) for step in accountant.history],
        # for a reader of the file; not read back (recomputed from the history)
        "epsilon": accountant.epsilon(),
        "delta": accountant.dp.delta,
    }
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)
