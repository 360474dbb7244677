"""Run an aiohttp app as a service: bind, serve until stopped, clean up; one shape for all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from aiohttp import web

from services.lifecycle import stop_on_signals
from services.redis_conn import connect
from shared.settings import RedisSettings

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
