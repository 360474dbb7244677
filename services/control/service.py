"""Run the control app until stopped: AppRunner + TCPSite, the shared lifecycle."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from aiohttp import web

from services.control.app import create_app
from services.lifecycle import stop_on_signals
from services.redis_conn import connect
from shared.settings import Settings

log = logging.getLogger(__name__)


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
) -> None:
    stopping = stopping or asyncio.Event()
    client = redis if redis is not None else connect(settings.redis)
    runner = web.AppRunner(create_app(settings, client), access_log=None)
    try:
        with stop_on_signals(stopping, handle_signals):
            await runner.setup()
            await web.TCPSite(runner, settings.control.host, settings.control.port).start()
            log.info("control service on http://%s:%d", *runner.addresses[0][:2])
            if settings.control.token is None:
                log.warning("no FEDASYNC_CONTROL__TOKEN: every write will be refused")
            await stopping.wait()
    finally:
        await runner.cleanup()
        if redis is None:
            await client.aclose()
