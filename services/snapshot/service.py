"""Run the snapshot app until stopped: AppRunner + TCPSite, the shared lifecycle."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from aiohttp import web

from services.lifecycle import stop_on_signals
from services.redis_conn import connect
from services.snapshot.app import create_app
from shared.settings import Settings

log = logging.getLogger(__name__)


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve until `stopping` is set; `started` receives the bound port (0 picks a free one)."""
    stopping = stopping or asyncio.Event()
    client = redis if redis is not None else connect(settings.redis)
    runner = web.AppRunner(create_app(settings, client), access_log=None)
    try:
        with stop_on_signals(stopping, handle_signals):
            await runner.setup()
            site = web.TCPSite(runner, settings.snapshot.host, settings.snapshot.port)
            await site.start()
            port = runner.addresses[0][1]
            log.info("snapshot service on http://%s:%d", settings.snapshot.host, port)
            if started is not None:
                started.set_result(port)
            await stopping.wait()
    finally:
        await runner.cleanup()
        if redis is None:
            await client.aclose()
