"""Run an aiohttp app as a service: bind, serve until stopped, clean up; one shape for all.

Every service listens through `listening`, behind the connection guard (runtime/http_guard.py:
deadlines for request heads and bodies, a bound on open connections), and no service inflates a
compressed request body (`auto_decompress=False`): nothing is ever decompressed, so no small body
can grow into a large one in memory. A body a handler leaves unread is not drained either
(`lingering_time=0`): the connection closes after the answer. A request aiohttp cannot parse is
answered as JSON and logged in one line (runtime/http_malformed.py).

Also the health answers every HTTP service gives (`/livez`, and `/readyz` built on a Redis PING),
so a load balancer or a compose healthcheck reads them the same way everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.runtime.http_guard import FastPath, Guard, GuardCollector
from fedasync.services.runtime.http_malformed import handler_factory
from fedasync.services.runtime.lifecycle import Background, stop_on_signals
from fedasync.services.runtime.prometheus import REGISTRY
from fedasync.services.runtime.redis_cluster import is_cluster, on_node_of
from fedasync.services.runtime.redis_conn import TRANSIENT, connect
from fedasync.services.runtime.settings import HttpSettings, RedisSettings, Settings

log = logging.getLogger(__name__)

#: an app's answers for its hottest requests, served by the guard without aiohttp (http_guard.py)
FAST_PATH = web.AppKey("fast_path", FastPath)

#: the app's one background loop, if it has one (lifecycle.Background): its /readyz vouches for
#: it, and a refusal it ends with ends the service
BACKGROUND = web.AppKey("background", Background)

#: aiohttp's request handler options for every service (an app's own handler_args win)
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False, "lingering_time": 0}


class CannotListen(Exception):
    """The (host, port) a service's settings name cannot be listened on: the port is in use (or
    privileged), or the host is no address of this machine. Not an OSError on purpose, so no
    retry of transient network errors takes it for one; the entry point reports it in one line
    naming the setting (services/runtime/entry.py)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        self.host = host
        self.port = port
        #: the host is at fault (no address of this machine, a name that does not resolve)
        self.host_is_wrong = isinstance(cause, socket.gaierror) or cause.errno in (
            errno.EADDRNOTAVAIL,
        )
        if cause.errno == errno.EADDRINUSE:
            reason = "the port is in use (another process listens on it)"
        else:
            reason = (cause.strerror or str(cause)).lower()
        self.reason = reason
        super().__init__(f"cannot listen on {host}:{port}: {reason}")


@contextlib.asynccontextmanager
async def listening(
    name: str,
    app: web.Application,
    host: str,
    port: int,
    limits: HttpSettings,
    *,
    reuse_port: bool = False,
) -> AsyncIterator[int]:
    """Serve `app` on (host, port) behind the guard until the block ends; yields the bound port.

    The guard's figures join the app's metrics registry (`prometheus.REGISTRY`) if it has one, and
    the app's `FAST_PATH`, if it has one, answers before aiohttp. With `reuse_port`, several
    processes may listen on the same port (SO_REUSEPORT: the kernel spreads connections).
    `CannotListen` when (host, port) cannot be listened on.
    """
    guard = Guard(limits, name, app.get(FAST_PATH))
    runner = web.AppRunner(app, access_log=None, **HANDLER_ARGS)
    guard.watch_app(app)
    registry = app.get(REGISTRY)
    collector = GuardCollector(guard)
    if registry is not None:
        registry.register(collector)
    listener: asyncio.Server | None = None
    try:
        await runner.setup()
        assert runner.server is not None
        guard.watch_server(runner.server)
        loop = asyncio.get_running_loop()
        try:
            listener = await loop.create_server(
                guard.protocol_factory(handler_factory(runner.server, guard.malformed)),
                host,
                port,
                reuse_address=True,
                reuse_port=reuse_port or None,
                backlog=128,
            )
        except OSError as exc:  # in use, privileged, no such address: the settings' to fix
            raise CannotListen(host, port, exc) from exc
        yield listener.sockets[0].getsockname()[1]
    finally:
        if listener is not None:
            listener.close()  # no new connections; those open are drained by the runner
        await runner.cleanup()
        guard.close_all_timers()
        if registry is not None:
            registry.unregister(collector)


async def serve(
    name: str,
    make_app: Callable[[aioredis.Redis], web.Application],
    redis_settings: RedisSettings,
    host: str,
    port: int,
    limits: HttpSettings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve until `stopping` is set; `started` receives the bound port (0 picks a free one)."""
    stopping = stopping or asyncio.Event()
    client = redis if redis is not None else connect(redis_settings)
    try:
        with stop_on_signals(stopping, handle_signals):
            app = make_app(client)
            async with listening(name, app, host, port, limits, reuse_port=reuse_port) as bound:
                log.info("%s on http://%s:%d", name, host, bound)
                if started is not None:
                    started.set_result(bound)
                await _until_stopped_or_refused(stopping, app.get(BACKGROUND))
    finally:
        if redis is None:
            await client.aclose()


async def _until_stopped_or_refused(stopping: asyncio.Event, background: Background | None) -> None:
    """Until `stopping` is set, or the background loop ends refusing to run (raised here, for the
    entry point's one line and exit code 2). A loop that ended otherwise leaves the service up,
    saying so on /readyz, for the orchestrator to restart."""
    if background is not None and background.task is not None:
        stopped = asyncio.create_task(stopping.wait(), name="until-stopped")
        try:
            await asyncio.wait({stopped, background.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        refusal = background.refusal()
        if refusal is not None:
            raise refusal
    await stopping.wait()


class ServiceRun(Protocol):
    """A service's `run`: serve until stopped (tests pass a client, an event, a port future)."""

    async def __call__(
        self,
        settings: Settings,
        *,
        redis: aioredis.Redis | None = None,
        handle_signals: bool = True,
        stopping: asyncio.Event | None = None,
        started: asyncio.Future[int] | None = None,
    ) -> None: ...


def http_service(
    name: str,
    create_app: Callable[[Settings, aioredis.Redis], web.Application],
    address: Callable[[Settings], tuple[str, int]],
) -> ServiceRun:
    """The `run` of a service that is one aiohttp app at the (host, port) its settings name."""

    async def run(
        settings: Settings,
        *,
        redis: aioredis.Redis | None = None,
        handle_signals: bool = True,
        stopping: asyncio.Event | None = None,
        started: asyncio.Future[int] | None = None,
    ) -> None:
        host, port = address(settings)
        await serve(
            name,
            lambda client: create_app(settings, client),
            settings.redis,
            host,
            port,
            settings.http,
            redis=redis,
            handle_signals=handle_signals,
            stopping=stopping,
            started=started,
        )

    return run


async def livez(request: web.Request) -> web.Response:
    """Alive: the process answers (nothing else is checked)."""
    return web.json_response({"status": "alive"})


async def redis_readiness(
    redis: aioredis.Redis,
    background: Background | None = None,
    *,
    key: str | None = None,
    **ready: Any,
) -> web.Response:
    """503 while Redis does not answer a PING, or once `background` (the service's loop) has died;
    else 200 with `ready` in the body.

    On a Redis Cluster the PING goes to the primary of `key`'s slot (the run's node: a PING to
    the default node says nothing about it), and without a key to a primary of the client's
    choice."""
    failure = background.failure() if background is not None else None
    if failure is not None:
        return web.json_response(
            {"status": "background task stopped", "error": failure}, status=503
        )
    try:
        if key is not None and is_cluster(redis):
            await on_node_of(redis, key, "PING")
        else:
            await redis.ping()
    except TRANSIENT as exc:
        return web.json_response({"status": "redis unreachable", "error": str(exc)}, status=503)
    return web.json_response({"status": "ready", **ready})
