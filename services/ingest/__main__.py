"""Entry point: `python -m services.ingest`."""

from __future__ import annotations

import sys

from services.entry import run_service
from services.ingest.service import run


def main() -> int:
    return run_service("ingest", run)


if __name__ == "__main__":
    sys.exit(main())
