"""The aggregator's stream gauges against a real Redis: length, pending and lag as Redis holds
them, read at most once a second (the test's clock, moved instead of slept)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.stream_gauges import GAUGES_INTERVAL_S, StreamGauges
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_the_gauges_follow_the_stream_at_most_once_a_second(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics = AggregatorMetrics()
    sample = metrics.registry.get_sample_value
    clock = [1000.0]
    gauges = StreamGauges(redis, keys, metrics, clock=lambda: clock[0])
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
    for i in range(3):
        await publish(redis, keys, make_update(f"g{i}", base=0))
    await redis.xreadgroup(AGGREGATOR_GROUP, "reader", {keys.updates: ">"}, count=2)

    await gauges.update()
    figures = ("stream_length", "pending", "lag")
    assert [sample(f"fedasync_aggregator_{f}") for f in figures] == [3, 2, 1]

    await redis.xreadgroup(AGGREGATOR_GROUP, "reader", {keys.updates: ">"}, count=1)
    clock[0] += GAUGES_INTERVAL_S / 2
    await gauges.update()  # read too recently: the figures stay
    assert [sample(f"fedasync_aggregator_{f}") for f in figures] == [3, 2, 1]

    clock[0] += GAUGES_INTERVAL_S / 2
    await gauges.update()
    assert [sample(f"fedasync_aggregator_{f}") for f in figures] == [3, 3, 0]
