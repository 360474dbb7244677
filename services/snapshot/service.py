"""Run the snapshot service until stopped: one process, or several sharing its port.

With `FEDASYNC_SNAPSHOT__WORKERS=N` (N > 1) this process binds the port with SO_REUSEPORT first
(so port 0 resolves to one free port), then starts N-1 worker processes
(`python -m fedasync.services.snapshot.worker`) that bind the same port; the kernel spreads new
connections over them. Each worker is a whole snapshot service: its own Redis connection, its own
follower of versions (so each freezes by itself should Redis move back in time), its own cache,
its own guard (http_guard.py: every slow-client limit, and `MAX_CONNECTIONS` per worker) and its
own /metrics. Nothing is shared but the port: a polling fleet's requests need no coordination,
and N processes use N cores, which one Python process cannot.

This process supervises the others: one that exits is started again (after a pause, so a worker
that cannot start does not spin); a stop (SIGTERM) stops them all, each draining as one service
does. Should this process die without stopping them, the kernel stops them (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.http_service import serve
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.app import create_app

log = logging.getLogger(__name__)

NAME = "snapshot service"
#: pause before a worker that exited is started again
RESTART_S = 1.0
#: how long stopping workers may drain before they are killed
STOP_S = 30.0


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve until stopped; with several workers, this process is worker 0 and their keeper."""
    workers = settings.snapshot.workers
    stopping = stopping or asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        serve_one(
            settings,
            worker=0,
            redis=redis,
            handle_signals=handle_signals,
            stopping=stopping,
            started=bound,
            reuse_port=workers > 1,
        )
    )
    waiting: list[asyncio.Future[Any]] = [bound, serving]
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not bound.done():
        await serving  # it failed before binding: its error
        return
    if started is not None:
        started.set_result(bound.result())
    if workers == 1:
        await serving
        return
    keeper = asyncio.create_task(keep_workers(workers - 1, bound.result(), stopping))
    try:
        await serving
    finally:
        stopping.set()
        await keeper


async def serve_one(
    settings: Settings,
    *,
    worker: int,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
    reuse_port: bool = False,
) -> None:
    """One snapshot service process (worker `worker`), at the settings' host and port."""
    await serve(
        NAME,
        lambda client: create_app(settings, client, worker=worker),
        settings.redis,
        settings.snapshot.host,
        settings.snapshot.port,
        settings.http,
        redis=redis,
        handle_signals=handle_signals,
        stopping=stopping,
        started=started,
        reuse_port=reuse_port,
    )


async def keep_workers(count: int, port: int, stopping: asyncio.Event) -> None:
    """Workers 1..count on `port` until `stopping`; a worker that exits is started again."""
    await asyncio.gather(*(_keep(worker, port, stopping) for worker in range(1, count + 1)))


async def _keep(worker: int, port: int, stopping: asyncio.Event) -> None:
    env = dict(os.environ, FEDASYNC_SNAPSHOT__PORT=str(port), FEDASYNC_SNAPSHOT__WORKERS="1")
    while not stopping.is_set():
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fedasync.services.snapshot.worker",
            str(worker),
            env=env,
            preexec_fn=_die_with_parent,
        )
        stopped = asyncio.create_task(stopping.wait())
        exited = asyncio.create_task(process.wait())
        await asyncio.wait([stopped, exited], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if exited.done() and not stopping.is_set():  # (a Ctrl-C reaches it too: no error)
            log.error(
                "snapshot worker %d exited with %s; starting it again in %.0f s",
                worker,
                process.returncode,
                RESTART_S,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), RESTART_S)
            continue
        with contextlib.suppress(ProcessLookupError):
            if process.returncode is None:
                process.terminate()  # SIGTERM: it drains as one service does
        try:
            await asyncio.wait_for(exited, STOP_S)
        except TimeoutError:
            log.error("snapshot worker %d did not stop within %.0f s: killed", worker, STOP_S)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await exited


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the keeper dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
