"""The poisoning bound through the real services: set by PATCH, decided by the aggregator.

Seven ordinary updates all pull the model towards the same weights, so their delta norms shrink
and none is beyond 3 × their median; then one update far away (weights of 1000) is.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from fedasync.services.aggregator.service import Aggregator
from fedasync.services.control.app import create_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.services.stores.policy_store import ensure_policy
from fedasync.shared.keys import Keys
from tests.integration.helpers import dead_letters, initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "s3cret-operator-token"


async def patch_bound(settings: Settings, redis: aioredis.Redis, action: str) -> None:
    """Turn the bound on the way an operator would: PATCH /v1/policy on the control service."""
    settings = settings.model_copy(
        update={"control": settings.control.model_copy(update={"token": TOKEN})}
    )
    await ensure_policy(redis, Keys(settings.redis.key_prefix), settings.policy.to_policy())
    changes = {"norm_bound": 3.0, "norm_window": 5, "norm_action": action}
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        response = await client.patch(
            "/v1/policy",
            json={"changes": changes, "why": "poisoning bound"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert response.status == 200, await response.text()
        policy = (await response.json())["policy"]
    assert {k: policy[k] for k in changes} == changes


async def run_with_one_huge_update(settings: Settings, redis: aioredis.Redis) -> Aggregator:
    keys = Keys(settings.redis.key_prefix)
    for i in range(7):
        await publish(redis, keys, make_update(f"ok{i}", base=0))
    await publish(redis, keys, make_update("huge", base=7, value=1000.0))
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    await aggregator.run(asyncio.Event(), burst=True)
    return aggregator


async def test_an_oversize_update_is_rejected_with_its_reason_in_ledger_and_metrics(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await patch_bound(settings, redis, "reject")
    aggregator = await run_with_one_huge_update(settings, redis)

    entries = await ledger(redis, keys)
    assert [e["outcome"] for e in entries] == ["applied"] * 7 + ["rejected"]
    huge = entries[-1]
    assert (huge["update_id"], huge["reason"], huge["policy_version"]) == ("huge", "norm_bound", 1)
    assert huge["delta_norm"] > 1000
    assert "bound" in huge["detail"]
    assert aggregator.state.version == 7
    assert [d[b"reason"] for d in await dead_letters(redis, keys)] == [b"norm_bound"]
    text = generate_latest(aggregator.metrics.registry).decode()
    assert 'fedasync_aggregator_rejections_total{reason="norm_bound"} 1.0' in text
    assert "fedasync_aggregator_clipped_total 0.0" in text
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()  # a replay of the ledger rejects it the same way


async def test_an_oversize_update_is_clipped_and_counted(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await patch_bound(settings, redis, "clip")
    aggregator = await run_with_one_huge_update(settings, redis)

    entries = await ledger(redis, keys)
    assert [e["outcome"] for e in entries] == ["applied"] * 8
    assert [e["clipped"] for e in entries] == [False] * 7 + [True]
    assert entries[-1]["delta_norm"] == aggregator.state.norms[-1]
    text = generate_latest(aggregator.metrics.registry).decode()
    assert "fedasync_aggregator_clipped_total 1.0" in text
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
