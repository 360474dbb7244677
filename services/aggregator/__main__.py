"""Entry point: settings and logging are built here, then the service runs until stopped."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.aggregator.commit import CommitConflict, Fenced
from services.aggregator.service import run
from services.logs import configure
from shared.settings import SettingsError, load_settings

log = logging.getLogger("services.aggregator")


def main() -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 2
    configure(settings.log, "aggregator")
    try:
        result = asyncio.run(run(settings))
    except Fenced as exc:
        log.error("stopping: %s (another aggregator is running)", exc)
        return 3
    except CommitConflict as exc:
        log.error("stopping: %s", exc)
        return 3
    log.info("stopped at version %d after %d commits", result.version, result.commits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
