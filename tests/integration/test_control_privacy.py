"""Differential privacy through the control service, against a real Redis and the real
aggregator: `/v1/status`'s `privacy` (ε, and the adaptive clip the aggregator is at), and the
runtime changes a run may never take back (a privacy budget raised, unset, spent already, or
counted under another model; DP turned off)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.app import create_app
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import Keys
from fedasync.shared.wire import unpack
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "privacy-operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: large enough that five updates never reach it, under either accounting
BUDGET = 1000.0


def with_policy(settings: Settings, **policy: Any) -> Settings:
    control = settings.control.model_copy(update={"token": TOKEN, "open_reads": True})
    return settings.model_copy(
        update={"control": control, "policy": type(settings.policy)(**policy)}
    )


async def trained(
    settings: Settings, redis: aioredis.Redis, *, buffered: bool = False
) -> list[dict[str, Any]]:
    """Five updates from five devices, decided; the ledger. Each from the model the one before
    made (FedAsync steps at every update), or, `buffered`, all from model 0 (one FedBuff step
    of K = 5)."""
    keys = Keys(settings.redis.key_prefix)
    for i in range(5):
        base = 0 if buffered else i
        await publish(redis, keys, make_update(f"p{i}", base=base, client=f"device-{i}"))
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    return await ledger(redis, keys)


@pytest_asyncio.fixture
async def dp(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    settings = with_policy(
        settings, dp_clip=1.0, dp_population=50, dp_participation=100, privacy_budget=BUDGET
    )
    await trained(settings, redis)
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        yield client


async def patch(client: TestClient, **changes: Any) -> tuple[int, dict[str, Any]]:
    response = await client.patch("/v1/policy", json={"changes": changes}, headers=AUTH)
    return response.status, await response.json()


async def test_status_shows_the_epsilon_of_the_newest_decision_and_the_dp_settings(
    dp: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    newest = (await ledger(redis, Keys(settings.redis.key_prefix)))[-1]
    status = await (await dp.get("/v1/status")).json()
    assert status["privacy"] == {
        "epsilon_sampled": newest["epsilon_sampled"],
        "epsilon_conservative": newest["epsilon_conservative"],
        "delta": 1e-5,
        "budget": BUDGET,
        "model": "conservative",
        "clip": 1.0,
        "clip_configured": 1.0,
    }
    assert newest["epsilon_conservative"] > 0


async def test_status_shows_the_adaptive_clip_the_aggregator_is_at_and_the_configured_one(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = with_policy(
        settings,
        mode="fedbuff",
        buffer_size=5,
        dp_clip=1.0,
        dp_quantile=0.5,
        dp_count_noise=1.0,
        dp_participation=100,
    )
    records = await trained(settings, redis, buffered=True)
    raw = await get_bytes(redis, Keys(settings.redis.key_prefix).state)
    assert raw is not None
    live = unpack(raw, max_bytes=len(raw))["privacy"]["clip"]  # the aggregator's checkpoint
    assert records[-1]["server_step"]
    assert records[-1]["adaptive_clip"] == live != 1.0  # the step moved it
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        privacy = (await (await client.get("/v1/status")).json())["privacy"]
    assert (privacy["clip"], privacy["clip_configured"]) == (live, 1.0)


async def test_a_run_without_dp_shows_no_privacy(settings: Settings, redis: aioredis.Redis) -> None:
    settings = with_policy(settings)
    records = await trained(settings, redis)
    assert all("epsilon_conservative" not in r for r in records)  # byte-identical ledgers
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        status = await (await client.get("/v1/status")).json()
    assert status["privacy"] is None


async def test_the_privacy_budget_may_be_lowered_never_raised_nor_unset(dp: TestClient) -> None:
    # refused by the core's rule (`Policy.evolve`, Conflict): a 409 naming the field
    raised, body = await patch(dp, privacy_budget=BUDGET + 1)
    assert (raised, body["field"]) == (409, "privacy_budget")
    assert "never raised or unset" in body["error"]
    unset, body = await patch(dp, privacy_budget=None)
    assert (unset, body["field"]) == (409, "privacy_budget")
    assert "never raised or unset" in body["error"]
    lowered, body = await patch(dp, privacy_budget=BUDGET / 2)
    assert lowered == 200
    assert body["policy"]["privacy_budget"] == BUDGET / 2
    again, _ = await patch(dp, privacy_budget=BUDGET)  # back up to the first: a raise too
    assert again == 409


async def test_a_privacy_budget_already_spent_is_refused_with_what_was_spent(
    dp: TestClient,
) -> None:
    spent = (await (await dp.get("/v1/status")).json())["privacy"]["epsilon_conservative"]
    status, body = await patch(dp, privacy_budget=spent / 2)
    assert (status, body["field"], body["used"]) == (409, "privacy_budget", spent)
    assert "already spent" in body["error"]
    policy = await (await dp.get("/v1/policy")).json()
    assert policy["policy"]["privacy_budget"] == BUDGET  # unchanged


async def test_dp_cannot_be_turned_off_nor_the_budget_counted_under_another_model(
    dp: TestClient,
) -> None:
    off, body = await patch(dp, dp_clip=None)
    assert (off, body["field"]) == (409, "dp_clip")
    assert "cannot be turned off" in body["error"]
    model, body = await patch(dp, privacy_model="sampled")
    assert (model, body["field"]) == (409, "privacy_model")
    assert "fixed during a run with DP" in body["error"]
    other_clip, _ = await patch(dp, dp_clip=2.0)  # a new C: still DP
    assert other_clip == 200


async def test_a_budget_may_be_set_at_runtime_in_a_run_that_had_none(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = with_policy(settings, dp_clip=1.0, dp_participation=100)
    await trained(settings, redis)
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        status, body = await patch(client, privacy_budget=BUDGET)
        assert status == 200
        assert body["policy"]["privacy_budget"] == BUDGET
