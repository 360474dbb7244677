"""Entry point: `python -m fedasync.services.worker`."""

from __future__ import annotations

import sys

from fedasync.services.runtime.entry import run_service
from fedasync.services.worker.service import run


def main() -> int:
    return run_service(
        lambda s: f"worker-{s.worker.device_index}",
        run,
        builds_task=True,
        # a device publishing through the ingest service holds no Redis credentials
        needs_redis=lambda s: s.worker.ingest_url is None,
    )


if __name__ == "__main__":
    sys.exit(main())
