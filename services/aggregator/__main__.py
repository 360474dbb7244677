"""Entry point: `python -m services.aggregator`; exits 3 when fenced off by a newer aggregator."""

from __future__ import annotations

import sys

from services.aggregator.commit import CommitConflict, Fenced
from services.aggregator.service import run
from services.entry import run_service


def main() -> int:
    return run_service("aggregator", run, fatal=(Fenced, CommitConflict))


if __name__ == "__main__":
    sys.exit(main())
