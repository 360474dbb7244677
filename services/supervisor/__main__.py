"""Entry point: `python -m fedasync.services.supervisor`."""

from __future__ import annotations

import sys

from fedasync.services.runtime.entry import run_service
from fedasync.services.supervisor.service import run


def main() -> int:
    return run_service("supervisor", run, listens_on="supervisor")


if __name__ == "__main__":
    sys.exit(main())
