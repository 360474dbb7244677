"""Run an aiohttp app as a service: bind, serve until stopped, clean up; one shape for all.

Also the health answers every HTTP service gives (`/livez`, and `/readyz` built on a Redis PING),
so a load balancer or a compose healthcheck reads them the same way everywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.runtime.lifecycle import Background, stop_on_signals
from fedasync.services.runtime.redis_conn import TRANSIENT, connect
from fedasync.services.runtime.settings import RedisSettings, Settings

log = logging.getLogger(__name__)


async def serve(
    name: str,
    make_app: Callable[[aioredis.Redis], web.Application],
    redis_settings: RedisSettings,
    host: str,
    port: int,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve until `stopping` is set; `started` receives the bound port (0 picks a free one)."""
    stopping = stopping or asyncio.Event()
    client = redis if redis is not None else connect(redis_settings)
    runner = web.AppRunner(make_app(client), access_log=None)
    try:
        with stop_on_signals(stopping, handle_signals):
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
            bound = runner.addresses[0][1]
            log.info("%s on http://%s:%d", name, host, bound)
            if started is not None:
                started.set_result(bound)
            await stopping.wait()
    finally:
        await runner.cleanup()
        if redis is None:
            await client.aclose()


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
    redis: aioredis.Redis, background: Background | None = None, **ready: Any
) -> web.Response:
    """503 while Redis does not answer a PING, or once `background` (the service's loop) has died;
    else 200 with `ready` in the body."""
    failure = background.failure() if background is not None else None
    if failure is not None:
        return web.json_response(
            {"status": "background task stopped", "error": failure}, status=503
        )
    try:
        await redis.ping()
    except TRANSIENT as exc:
        return web.json_response({"status": "redis unreachable", "error": str(exc)}, status=503)
    return web.json_response({"status": "ready", **ready})
