"""Run the control app until stopped."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from services.control.app import create_app
from services.http_service import serve
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
    if settings.control.token is None:
        log.warning("no FEDASYNC_CONTROL__TOKEN: every write will be refused")
    await serve(
        "control service",
        lambda client: create_app(settings, client),
        settings.redis,
        settings.control.host,
        settings.control.port,
        redis=redis,
        handle_signals=handle_signals,
        stopping=stopping,
        started=started,
    )
