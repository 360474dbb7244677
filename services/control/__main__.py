"""Entry point: `python -m services.control`."""

from __future__ import annotations

import sys

from services.control.service import run
from services.entry import run_service


def main() -> int:
    return run_service("control", run)


if __name__ == "__main__":
    sys.exit(main())
