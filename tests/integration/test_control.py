"""The control service against a real Redis and the real aggregator: policy changes and auth."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.app import create_app
from fedasync.services.control.openapi import spec
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.services.stores.keys import Keys
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "s3cret-operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    settings = settings.model_copy(
        update={"control": settings.control.model_copy(update={"token": TOKEN})}
    )
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    async with TestClient(TestServer(create_app(settings, redis))) as test_client:
        yield test_client


async def test_operator_patch_changes_alpha_of_the_next_decisions(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    response = await client.patch(
        "/v1/policy",
        json={"changes": {"alpha0": 0.25}, "why": "calmer"},
        headers=AUTH | {"X-Fedasync-Operator": "alice"},
    )
    assert response.status == 200
    assert (await response.json())["policy"]["version"] == 1
    await publish(redis, keys, make_update("after", base=0))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    [entry] = await ledger(redis, keys)
    assert (entry["policy_version"], entry["alpha"]) == (1, 0.25)
    log = await redis.xrange(keys.policy_log)
    assert [(f[b"who"], f[b"why"]) for _, f in log] == [(b"alice", b"calmer")]
    status = await (await client.get("/v1/status")).json()
    assert (status["version"], status["policy_version"], status["decisions"]) == (1, 1, 1)
    recent = status["recent"]
    assert recent["alpha"]["p50"] == 0.25
    assert recent["tau"]["max"] == 0.0
    assert recent["clients"] == [{"client": "c0", "applied": 1, "decided": 1, "rate": 1.0}]
    assert (status["pending"], status["lag"], status["switches_on"]) == (0, 0, [])
    assert status["budget_left_updates"] == settings.budget.max_updates - 1


async def test_invalid_values_get_422_with_field_and_range(client: TestClient) -> None:
    response = await client.patch("/v1/policy", json={"changes": {"gamma": -1}}, headers=AUTH)
    assert response.status == 422
    body = await response.json()
    assert (body["field"], body["allowed"]) == ("gamma", "(0, 10]")
    unknown = await client.patch("/v1/policy", json={"changes": {"alpha": 1}}, headers=AUTH)
    assert unknown.status == 422
    assert (await client.patch("/v1/policy", data=b"{", headers=AUTH)).status == 400
    for path, method in (("/v1/policy", client.patch), ("/v1/switches/raise-gamma", client.post)):
        not_utf8 = await method(path, data=b"\xff\xfe{}", headers=AUTH)
        assert not_utf8.status == 400, path
        assert "JSON" in (await not_utf8.json())["error"]


async def test_writes_without_a_valid_token_are_refused(client: TestClient) -> None:
    missing = await client.patch("/v1/policy", json={"changes": {"alpha0": 0.5}})
    assert missing.status == 401
    assert "error" in await missing.json()
    wrong = await client.patch(
        "/v1/policy",
        json={"changes": {"alpha0": 0.5}},
        headers={"Authorization": "Bearer wrong-token-of-length"},
    )
    assert wrong.status == 403
    policy = await (await client.get("/v1/policy")).json()
    assert policy["policy"]["version"] == 0  # nothing changed
    assert policy["ranges"]["alpha0"] == "[0.001, 1]"


async def test_openapi_document_describes_every_route(client: TestClient) -> None:
    document = await (await client.get("/openapi.json")).json()
    assert document == spec()
    app: web.Application = client.server.app
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert routes == documented


async def test_switch_on_changes_the_policy_and_off_restores_it(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    on = await client.post(
        "/v1/switches/raise-gamma", json={"on": True, "reason": "rate spike"}, headers=AUTH
    )
    assert on.status == 200
    assert (await on.json())["policy"]["gamma"] == pytest.approx(0.9)
    listed = await (await client.get("/v1/switches")).json()
    assert listed["raise-gamma"]["on"] is True
    assert listed["raise-gamma"]["saved"] == {"gamma": 0.6}
    assert listed["lower-alpha"]["on"] is False
    again = await client.post("/v1/switches/raise-gamma", json={"on": True}, headers=AUTH)
    assert again.status == 409
    off = await client.post("/v1/switches/raise-gamma", json={"on": False}, headers=AUTH)
    policy = (await off.json())["policy"]
    assert (policy["gamma"], policy["version"]) == (0.6, 2)
    keys = Keys(settings.redis.key_prefix)
    whys = [f[b"why"].decode() for _, f in await redis.xrange(keys.policy_log)]
    assert whys == ["switch raise-gamma on: rate spike", "switch raise-gamma off: "]
    assert (await client.post("/v1/switches/nope", json={"on": True}, headers=AUTH)).status == 404
    assert (await client.post("/v1/switches/lower-alpha", json={"on": True})).status == 401


async def test_pause_leaves_updates_in_the_stream_and_resume_decides_them(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    paused = await client.patch(
        "/v1/policy", json={"changes": {"paused": True}, "why": "maintenance"}, headers=AUTH
    )
    assert paused.status == 200
    await publish(redis, keys, make_update("waiting", base=0))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert await ledger(redis, keys) == []
    await client.patch("/v1/policy", json={"changes": {"paused": False}}, headers=AUTH)
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert [e["update_id"] for e in await ledger(redis, keys)] == ["waiting"]


async def test_a_budget_set_through_the_policy_ends_training(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    response = await client.patch(
        "/v1/policy", json={"changes": {"max_updates": 2}, "why": "enough"}, headers=AUTH
    )
    assert response.status == 200
    status = await (await client.get("/v1/status")).json()
    assert status["budget_left_updates"] == 2  # the policy's budget, not the configured 1000
    assert 0 < status["budget_left_seconds"] <= settings.budget.max_seconds
    for i in range(3):
        await publish(redis, keys, make_update(f"b{i}", base=min(i, 2)))
    result = await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert (result.version, result.closed) == (2, "max_updates")
    status = await (await client.get("/v1/status")).json()
    assert status["budget_left_updates"] == 0
    assert status["recent"]["totals"] == {"applied": 2, "dropped": 1}  # the third: closed
    bad = await client.patch("/v1/policy", json={"changes": {"max_updates": 0}}, headers=AUTH)
    assert (await bad.json())["field"] == "max_updates"


async def test_status_and_curve_show_the_evaluators_records(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    assert (await (await client.get("/v1/status")).json())["evaluation"] is None
    for version, accuracy in ((0, 0.1), (5, 0.5), (9, 0.8)):
        record = EvaluationRecord(
            version,
            10.0 + version,
            9.0 + version,
            1 - accuracy,
            accuracy,
            100,
            accuracy,
            {"0": accuracy, "1": accuracy / 2},
        )
        await evaluations.append(redis, keys, record, keep=1000)
    status = await (await client.get("/v1/status")).json()
    assert status["evaluation"]["version"] == 9
    assert status["evaluation"]["accuracy"] == 0.8
    curve = await (await client.get("/v1/evaluations", params={"count": "2"})).json()
    assert [r["version"] for r in curve] == [5, 9]  # the newest two, oldest first
    assert curve[1]["per_class"] == {"0": 0.8, "1": 0.4}
    assert (await client.get("/v1/evaluations", params={"count": "x"})).status == 400
