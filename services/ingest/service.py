"""Run the ingest app until stopped."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from services.http_service import serve
from services.ingest.app import create_app
from shared.settings import Settings


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> None:
    await serve(
        "ingest service",
        lambda client: create_app(settings, client),
        settings.redis,
        settings.ingest.host,
        settings.ingest.port,
        redis=redis,
        handle_signals=handle_signals,
        stopping=stopping,
        started=started,
    )
