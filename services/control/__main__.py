"""Entry point: `python -m fedasync.services.control`."""

from __future__ import annotations

import sys

from fedasync.services.control.service import run
from fedasync.services.runtime.entry import run_service


def main() -> int:
    return run_service("control", run, listens_on="control")


if __name__ == "__main__":
    sys.exit(main())
