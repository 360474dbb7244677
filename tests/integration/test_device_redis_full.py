"""A device writing straight to Redis rides out a Redis full to `maxmemory`, as one publishing
through ingest does (its `503 redis_out_of_memory`): the refused XADD kept nothing, so it is sent
again, uses up no attempt, and lands once memory is freed. Found by an outside fault injection:
`fedasync worker` without an ingest URL crashed on OutOfMemoryError.

A real Redis of the suite's own; the only stand-in is the client's `sleep`, which frees the
memory instead of waiting, so the test needs no timing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.client import DeviceClient, RetryPolicy
from fedasync.learning.tasks import get_task
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import Keys

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: more refusals in a row than the policy's attempts: an OOM must not use them up
REFUSALS = 4


async def test_a_device_writing_to_redis_waits_out_a_full_redis_and_publishes_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    config: Any = await redis.config_get("maxmemory")
    before = config["maxmemory"]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        """Instead of waiting: count the refusal; free the memory after REFUSALS of them."""
        waits.append(seconds)
        if len(waits) == REFUSALS:
            await redis.config_set("maxmemory", before)

    device = DeviceClient(
        "http://127.0.0.1:9/",  # never asked: this test only publishes
        "device-full",
        redis=redis,
        key_prefix=keys.prefix,
        retry=RetryPolicy(attempts=1),
        sleep=sleep,
    )
    weights = np.zeros(get_task("linear").layout.size, dtype=np.float32)
    update = device.prepare(weights, base_version=0, num_samples=10)
    await redis.config_set("maxmemory", 1)  # every write that allocates is refused
    try:
        async with device:
            published = await device.send(update)
    finally:
        await redis.config_set("maxmemory", before)

    assert len(waits) == REFUSALS  # each refusal waited out, none counted as an attempt
    entries = await redis.xrange(keys.updates)
    assert [entry_id.decode() for entry_id, _ in entries] == [published.entry_id]
