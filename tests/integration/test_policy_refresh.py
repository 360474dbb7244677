"""The aggregator's policy refresh against a real Redis: a change is taken between batches, the
record re-read at most every POLICY_REFRESH_S (the test's clock, moved instead of slept)."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.policy_refresh import POLICY_REFRESH_S, PolicyRefresh
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.policy_store import change_policy, ensure_policy
from fedasync.shared.keys import Keys

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_changed_policy_is_taken_at_the_next_read_and_not_before(
    settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics = AggregatorMetrics()
    clock = [1000.0]
    refresh = PolicyRefresh(redis, keys, settings.redis, metrics, clock=lambda: clock[0])
    refresh.policy = first = await ensure_policy(redis, keys, settings.policy.to_policy())

    await refresh.refresh(None)  # the first read finds what is in force: nothing changes
    assert refresh.policy == first
    await change_policy(redis, keys, first.evolve(alpha0=0.3), who="test", why="", at=0.0)
    clock[0] += POLICY_REFRESH_S / 2
    await refresh.refresh(None)  # read too recently: not re-read yet
    assert refresh.policy == first

    clock[0] += POLICY_REFRESH_S / 2
    with caplog.at_level(logging.INFO, logger="fedasync.services.aggregator.service"):
        await refresh.refresh(None)

    assert refresh.policy.version == first.version + 1
    assert refresh.policy.alpha0 == 0.3
    assert metrics.registry.get_sample_value("fedasync_aggregator_policy_version") == (
        first.version + 1
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"policy {first.version} → {first.version + 1}"
    ]
