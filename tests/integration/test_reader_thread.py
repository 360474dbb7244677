"""The aggregator's stream reads run on a thread of their own (services/aggregator/reader.py).

What the design rests on: a read is sent before the caller's loop runs again (the aggregator
decides synchronously right after sending its read-ahead), an abandoned read is cancelled, and
the thread ends with the run.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.reader import ReadThread
from fedasync.services.aggregator.service import run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys
from fedasync.services.stores.ledger import records
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEADLINE_S = 30.0


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fedasync-stream-reader"]


async def test_a_read_is_sent_without_the_callers_loop_running_again(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await publish(redis, keys, make_update("u0", base=0))
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0")
    before = set(reader_threads())
    reader = ReadThread(settings.redis)
    sent = threading.Event()

    async def read(client: aioredis.Redis) -> Any:
        reply = await client.xreadgroup(AGGREGATOR_GROUP, "c", {keys.updates: ">"}, count=10)
        sent.set()
        return reply

    try:
        future = reader.submit(read)
        # blocking this loop on purpose: the read must complete without it
        assert sent.wait(DEADLINE_S), "the read did not run while the caller's loop was busy"
        reply = await asyncio.wrap_future(future)
        assert len(reply[0][1]) == 1
    finally:
        await reader.close()
    assert set(reader_threads()) <= before


async def test_cancelling_a_submitted_read_cancels_it_on_the_reader_loop(
    settings: Settings,
) -> None:
    reader = ReadThread(settings.redis)
    started, cancelled = threading.Event(), threading.Event()

    async def read(client: aioredis.Redis) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()  # a read that never ends by itself
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        future = reader.submit(read)
        assert await asyncio.to_thread(started.wait, DEADLINE_S)
        future.cancel()
        assert await asyncio.to_thread(cancelled.wait, DEADLINE_S)
    finally:
        await reader.close()


async def test_the_reader_thread_ends_with_the_run_and_every_update_is_decided(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    before = set(reader_threads())
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    for i in range(50):
        await publish(redis, keys, make_update(f"u{i}", base=0))
    await run(settings, redis=redis, handle_signals=False, burst=True)
    assert set(reader_threads()) <= before
    decided = [r["update_id"] async for r in records(redis, keys)]
    assert sorted(decided) == sorted(f"u{i}" for i in range(50))
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
