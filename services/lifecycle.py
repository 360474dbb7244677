"""One lifecycle for every service: a signal sets an event, work drains, leftovers are cancelled.

After saq: SIGTERM/SIGINT only set `stopping`; the service's loops watch it, finish what they hold
and return. Whatever is still running after the grace period is cancelled and awaited, never
abandoned. SIGKILL needs no handling: the commit protocol makes any instant safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterable, Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_on_signals(stopping: asyncio.Event, enabled: bool = True) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT set `stopping` instead of killing the process."""
    if not enabled:
        yield
        return
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, _request_stop, stopping, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _request_stop(stopping: asyncio.Event, sig: signal.Signals) -> None:
    log.info("received %s: draining and stopping", sig.name)
    stopping.set()


async def cancel_tasks(tasks: Iterable[asyncio.Task[object]], timeout: float = 5.0) -> None:
    """Cancel `tasks` and wait for them, at most `timeout` seconds; log what would not stop."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if not pending:
        return
    done, still = await asyncio.wait(pending, timeout=timeout)
    for task in still:
        log.error("task %s did not stop within %.1f s", task.get_name(), timeout)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())
