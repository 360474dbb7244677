"""Entry point: settings and logging are built here, then the worker runs until done or stopped."""

from __future__ import annotations

import asyncio
import sys

from services.logs import configure
from services.worker.service import run
from shared.settings import SettingsError, load_settings


def main() -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    configure(settings.log, f"worker-{settings.worker.device_index}")
    asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
