"""Entry point: `python -m services.evaluator`."""

from __future__ import annotations

import sys

from services.entry import run_service
from services.evaluator.service import run


def main() -> int:
    return run_service("evaluator", run)


if __name__ == "__main__":
    sys.exit(main())
