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
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any

from fedasync.learning.task_failure import TaskCodeError
from fedasync.services.runtime.settings import SettingsError

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
    """Cancel `tasks` and wait for them, at most `timeout` seconds; log what would not stop.

    Every task that ended with an exception is logged, including one that had already ended
    before it was asked to stop: that is a background loop that died on its own, and without this
    line nobody would ever hear of it.
    """
    tasks = list(tasks)
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        _, still = await asyncio.wait(pending, timeout=timeout)
        for task in still:
            log.error("task %s did not stop within %.1f s", task.get_name(), timeout)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())


class Background:
    """The one background task a service's /readyz vouches for.

    A service whose real work is a loop beside its HTTP API (the evaluator's follower, the control
    service's rules) is not ready once that loop has ended without being asked to: the process
    still answers, so only /readyz can tell an orchestrator that it needs a restart.
    """

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self._stopping = False

    def refusal(self) -> SettingsError | TaskCodeError | None:
        """The error the task ended with when the loop found it must not run (a task other than
        the run's) or cannot (the task's own code fails, as it would again after a restart):
        it ends the whole service with exit code 2 and one line, not only its /readyz."""
        task = self.task
        if task is None or not task.done() or task.cancelled():
            return None
        exc = task.exception()
        return exc if isinstance(exc, SettingsError | TaskCodeError) else None

    def start(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        self.task = asyncio.create_task(work, name=name)
        return self.task

    def failure(self) -> str | None:
        """Why the task is no longer running though nobody stopped it; None while it runs."""
        task = self.task
        if task is None or not task.done() or self._stopping:
            return None
        if task.cancelled():
            return f"task {task.get_name()} was cancelled"
        exc = task.exception()
        if exc is None:
            return f"task {task.get_name()} ended"
        return f"task {task.get_name()} failed: {type(exc).__name__}: {exc}"

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the task (after the caller asked it to drain) and log how it ended."""
        self._stopping = True
        if self.task is not None and self.refusal() is None:  # a refusal is the exit's to say
            await cancel_tasks([self.task], timeout)
