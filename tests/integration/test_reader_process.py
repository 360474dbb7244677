"""Process mode (`aggregator.reader = "process"`): the reader process beside the decider.

Against a real redis-server: the same stream decided in process mode and in one-process mode
gives the same ledger, dead letters and model; a kill -9 of the reader while it holds delivered,
undecided entries loses none of them and decides none twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import Aggregator, run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.services.stores.policy_store import change_policy, read_policy
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import (
    dead_letters,
    decided,
    initial_state,
    ledger,
    make_update,
    publish,
    wait_for_ledger,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def in_mode(settings: Settings, mode: str, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "aggregator": settings.aggregator.model_copy(update={"reader": mode, "read_count": 4}),
            "redis": settings.redis.model_copy(update={"key_prefix": prefix}),
        }
    )


async def publish_mix(redis: aioredis.Redis, keys: Keys) -> None:
    """Applied, duplicate, stale and future updates, bad input of each kind, and one update
    far larger than a slot (the reader spills it: decided from Redis, in its place)."""
    for i in range(12):
        await publish(redis, keys, make_update(f"u{i}", base=max(i - 4, 0), value=float(i)))
        if i == 5:
            await publish(redis, keys, make_update("u2", base=0))  # a duplicate
            await publish(redis, keys, b"not an update")  # undecodable
            await redis.xadd(keys.updates, {"x": b"no message"})  # no message
            await redis.xadd(keys.updates, stream_entry.build_claim("sha256-00"))  # no store
            await publish(redis, keys, make_update("future", base=99))  # rejected by the core
            big = Update("big", "c1", 0, 10, np.ones(100_000, np.float32))
            await publish(redis, keys, encode_update(big))  # wrong size, larger than a slot
    for i in range(12, 30):
        await publish(redis, keys, make_update(f"u{i}", base=i - 12, value=0.5))


async def test_process_mode_decides_the_same_stream_as_one_process(
    settings: Settings, redis: aioredis.Redis
) -> None:
    prefix = settings.redis.key_prefix
    results = {}
    for mode in ("inline", "process"):
        mine = in_mode(settings, mode, f"{prefix}-{mode}")
        keys = Keys(mine.redis.key_prefix)
        await publish_mix(redis, keys)
        result = await run(
            mine, redis=redis, initial=initial_state(mine), handle_signals=False, burst=True
        )
        pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
        assert pending["pending"] == 0
        report = await verify(redis, keys, mine.wire.max_message_bytes)
        assert report.ok, report.describe()
        letters = [(f[b"reason"], f[b"payload"]) for f in await dead_letters(redis, keys)]
        raw = await redis.get(keys.model(result.version))
        assert raw is not None
        model = decode_model(raw).snapshot.weights.tobytes()
        results[mode] = (result.version, decided(await ledger(redis, keys)), letters, model)

    inline, process = results["inline"], results["process"]
    assert len(inline[1]) == 33  # every entry that reached the core, in both modes
    assert process[0] == inline[0]
    assert process[1] == inline[1]  # the same decisions, in the same order
    assert process[2] == inline[2]  # the same dead letters
    assert len(inline[2]) >= 4
    assert process[3] == inline[3]  # the same model, to the bit


async def test_kill_9_of_the_reader_loses_nothing_and_decides_nothing_twice(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = in_mode(settings, "process", settings.redis.key_prefix)
    settings = settings.model_copy(
        update={"aggregator": settings.aggregator.model_copy(update={"ring_slots": 4})}
    )
    keys = Keys(settings.redis.key_prefix)
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    stopping = asyncio.Event()
    running = asyncio.create_task(aggregator.run(stopping))
    try:
        for i in range(20):
            await publish(redis, keys, make_update(f"a{i}", base=max(i - 2, 0), client=f"c{i % 5}"))
        after = await wait_for_ledger(redis, keys, "0", 20)
        # pause the deciding: the reader fills its ring (4 slots) and waits for a free one
        current = await read_policy(redis, keys)
        await change_policy(redis, keys, current.evolve(paused=True), who="t", why="t", at=0.0)
        while not aggregator.policy.paused:
            await asyncio.sleep(0.01)
        for i in range(20, 50):
            await publish(redis, keys, make_update(f"a{i}", base=max(i - 2, 0), client=f"c{i % 5}"))
        feed = aggregator.feed
        assert feed is not None
        assert feed.started == 1
        ring = feed._ring
        assert ring is not None
        while ring.free() > 0:
            await asyncio.sleep(0.01)
        # a read the reader made and never published (it is killed between the two): ten
        # entries delivered to our consumer, pending, in no ring
        read: Any = await redis.xreadgroup(
            AGGREGATOR_GROUP, settings.aggregator.consumer, {keys.updates: ">"}, count=10
        )
        assert len(read[0][1]) == 10
        process = feed._process
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        assert process.exitcode == -signal.SIGKILL  # the kill happened
        assert len(await ledger(redis, keys)) == 20  # with 10 + what the ring holds undecided
        current = await read_policy(redis, keys)
        await change_policy(redis, keys, current.evolve(paused=False), who="t", why="t", at=0.0)
        await wait_for_ledger(redis, keys, after, 30)
        assert feed.started == 2  # a new reader re-read, from "0", what the dead one held
    finally:
        stopping.set()
        await running
    records = await ledger(redis, keys)
    assert [r["update_id"] for r in records] == [f"a{i}" for i in range(50)]
    assert [r["outcome"] for r in records] == ["applied"] * 50
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
