"""Entry point: `python -m services.snapshot`."""

from __future__ import annotations

import sys

from services.entry import run_service
from services.snapshot.service import run


def main() -> int:
    return run_service("snapshot", run)


if __name__ == "__main__":
    sys.exit(main())
