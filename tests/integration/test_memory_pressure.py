"""The aggregator's out-of-memory part against a real Redis: counted, alerted, its end said.

The clock is the test's own, moved instead of slept through."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.memory_pressure import OOM_ALERT_INTERVAL_S, MemoryPressure
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.alerts import REDIS_OOM
from fedasync.shared.keys import Keys

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

REFUSED = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")


async def alert_messages(redis: aioredis.Redis, keys: Keys) -> list[str]:
    alerts: Any = await redis.xrange(keys.alerts)
    return [f[b"message"].decode() for _, f in alerts if f[b"rule"] == REDIS_OOM.encode()]


async def test_refusals_are_counted_alerted_at_most_once_a_minute_and_their_end_said(
    settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics = AggregatorMetrics()
    clock = [1000.0]
    memory = MemoryPressure(redis, keys, metrics, clock=lambda: clock[0])

    await memory.refused(REFUSED)
    clock[0] += OOM_ALERT_INTERVAL_S / 2
    await memory.refused(REFUSED)  # within the minute: counted, not alerted again
    assert metrics.redis_oom._value.get() == 2
    assert memory.since == 1000.0
    [first] = await alert_messages(redis, keys)
    assert "for want of memory" in first
    assert "retrying" in first

    clock[0] += OOM_ALERT_INTERVAL_S / 2
    await memory.refused(REFUSED)  # a minute after the first alert: another
    assert len(await alert_messages(redis, keys)) == 2

    clock[0] += 5.0
    with caplog.at_level(logging.WARNING, logger="fedasync.services.aggregator.service"):
        await memory.passed()
    assert memory.since is None
    *_, last = await alert_messages(redis, keys)
    assert "for 65 s" in last
    assert "pass again" in last
    assert [r.getMessage() for r in caplog.records] == [last]


async def test_a_write_that_passes_with_nothing_refused_says_nothing(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics = AggregatorMetrics()
    memory = MemoryPressure(redis, keys, metrics)

    await memory.passed()

    assert await alert_messages(redis, keys) == []
    assert metrics.redis_oom._value.get() == 0
