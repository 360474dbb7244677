"""Entry point: `python -m fedasync.services.aggregator`; exits 3 when fenced off by a newer one."""

from __future__ import annotations

import sys

from fedasync.services.aggregator.commit import CommitConflict, Fenced
from fedasync.services.aggregator.service import run
from fedasync.services.runtime.entry import run_service


def main() -> int:
    return run_service("aggregator", run, fatal=(Fenced, CommitConflict), builds_task=True)


if __name__ == "__main__":
    sys.exit(main())
