"""Runs in a real Redis: created once, listed with the default run, their status derived from
their keys, and the middleware that gives each request its run (services/stores/runs.py,
services/runtime/run_routes.py)."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.run_routes import RUN, KnownRuns, RunContext, runs_middleware
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.runs import (
    create_run,
    list_runs,
    read_spec,
    run_exists,
    run_status,
    unregister,
)
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import RunSpec, RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def run_id(settings: Settings) -> str:
    """A run id unique to the test (the test prefix, made a run id)."""
    return settings.redis.key_prefix.lower().replace(".", "-")[:50] + "-r"


async def test_a_run_is_created_once_and_listed_after_the_default(
    redis: aioredis.Redis, settings: Settings, run_id: str
) -> None:
    try:
        spec = RunSpec(run_id, policy={"mode": "fedbuff"}, created_at=2.0, created_by="admin")
        assert await create_run(redis, spec)
        assert not await create_run(redis, RunSpec(run_id, policy={"mode": "fedasync"}))
        assert await read_spec(redis, run_id) == spec
        assert await run_exists(redis, run_id)
        default = settings.redis.key_prefix
        listed = await list_runs(redis, default)
        assert listed[0] == default
        assert run_id in listed
        entry = json.loads(await redis.hget(REGISTRY, run_id))
        assert entry == {"created_at": 2.0, "by": "admin"}
        assert await unregister(redis, run_id)
        assert run_id not in await list_runs(redis, default)
    finally:
        await redis.hdel(REGISTRY, run_id)


async def test_the_status_follows_the_runs_keys(redis: aioredis.Redis, run_id: str) -> None:
    keys = Keys(run_id)
    assert await run_status(redis, keys) == RunStatus.CREATED
    await redis.set(keys.version, 0)
    assert await run_status(redis, keys) == RunStatus.TRAINING
    await redis.set(keys.policy, json.dumps({"paused": True}))
    assert await run_status(redis, keys) == RunStatus.PAUSED
    await redis.hset(keys.done, mapping={"reason": "stopped"})
    assert await run_status(redis, keys) == RunStatus.DONE


async def test_the_middleware_gives_each_request_its_run(
    redis: aioredis.Redis, settings: Settings, run_id: str
) -> None:
    clients = RunClients(redis, settings.redis, settings.redis.key_prefix)
    known = KnownRuns(clients, run_exists, miss_s=0.0)

    async def which(request: web.Request) -> web.Response:
        context: RunContext = request[RUN]
        return web.json_response(
            {"run": context.id, "legacy": context.legacy, "updates": context.keys.updates}
        )

    app = web.Application(middlewares=[runs_middleware(known)])
    app.router.add_get("/v1/status", which)
    app.router.add_get("/v1/runs/{run}/status", which)
    async with TestClient(TestServer(app)) as client:
        legacy = await (await client.get("/v1/status")).json()
        assert legacy == {
            "run": settings.redis.key_prefix,
            "legacy": True,
            "updates": Keys(settings.redis.key_prefix).updates,
        }
        bad = await client.get("/v1/runs/Not%20one/status")
        assert bad.status == 400
        assert (await bad.json())["reason"] == "bad_run_id"
        unknown = await client.get(f"/v1/runs/{run_id}/status")
        assert unknown.status == 404
        assert (await unknown.json())["reason"] == "unknown_run"
        await create_run(redis, RunSpec(run_id))
        try:
            named = await (await client.get(f"/v1/runs/{run_id}/status")).json()
            assert named == {"run": run_id, "legacy": False, "updates": Keys(run_id).updates}
        finally:
            await redis.hdel(REGISTRY, run_id)
