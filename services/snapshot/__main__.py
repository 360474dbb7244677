"""Entry point: `python -m fedasync.services.snapshot`."""

from __future__ import annotations

import asyncio
import sys

from fedasync.services.runtime.entry import run_service
from fedasync.services.snapshot.service import run


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (Linux, macOS): the hot answers (fast.py) are socket writes,
    and its loop makes each about twice as cheap as the standard one's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the standard loop serves the same, slower
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main() -> int:
    return run_service("snapshot", run, listens_on="snapshot", loop_factory=new_event_loop)


if __name__ == "__main__":
    sys.exit(main())
