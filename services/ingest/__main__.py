"""Entry point: `python -m fedasync.services.ingest`."""

from __future__ import annotations

import sys

from fedasync.services.ingest.service import run
from fedasync.services.runtime.entry import run_service


def main() -> int:
    return run_service("ingest", run, listens_on="ingest")


if __name__ == "__main__":
    sys.exit(main())
