"""Entry point: settings and logging are built here, then the service runs until stopped."""

from __future__ import annotations

import asyncio
import sys

from services.logs import configure
from services.snapshot.service import run
from shared.settings import SettingsError, load_settings


def main() -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"snapshot: {exc}", file=sys.stderr)
        return 2
    configure(settings.log, "snapshot")
    asyncio.run(run(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
