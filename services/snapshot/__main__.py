"""Entry point: `python -m fedasync.services.snapshot`."""

from __future__ import annotations

import sys

from fedasync.services.runtime.entry import run_service
from fedasync.services.snapshot.service import run


def main() -> int:
    return run_service("snapshot", run)


if __name__ == "__main__":
    sys.exit(main())
