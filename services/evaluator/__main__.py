"""Entry point: `python -m fedasync.services.evaluator`."""

from __future__ import annotations

import sys

from fedasync.services.evaluator.service import run
from fedasync.services.runtime.entry import run_service


def main() -> int:
    return run_service("evaluator", run, builds_task=True, listens_on="evaluator")


if __name__ == "__main__":
    sys.exit(main())
