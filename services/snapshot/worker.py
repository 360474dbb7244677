"""Entry point of one extra snapshot worker: `python -m fedasync.services.snapshot.worker INDEX`.

Started by the snapshot service itself when `FEDASYNC_SNAPSHOT__WORKERS` > 1 (service.py), on the
port the first process bound; not meant to be run by hand.
"""

from __future__ import annotations

import functools
import sys

from fedasync.services.runtime.entry import run_service
from fedasync.services.snapshot.__main__ import new_event_loop
from fedasync.services.snapshot.service import serve_one


def main() -> int:
    worker = int(sys.argv[1])
    return run_service(
        f"snapshot-{worker}",
        functools.partial(serve_one, worker=worker, reuse_port=True),
        listens_on="snapshot",
        loop_factory=new_event_loop,
    )


if __name__ == "__main__":
    sys.exit(main())
