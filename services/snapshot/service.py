"""Run the snapshot app until stopped."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from services.http_service import serve
from services.snapshot.app import create_app
from shared.settings import Settings


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve until `stopping` is set; `started` receives the bound port (0 picks a free one)."""
    await serve(
        "snapshot service",
        lambda client: create_app(settings, client),
        settings.redis,
        settings.snapshot.host,
        settings.snapshot.port,
        redis=redis,
        handle_signals=handle_signals,
        stopping=stopping,
        started=started,
    )
