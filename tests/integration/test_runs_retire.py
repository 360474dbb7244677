"""`fedasync runs retire` on one redis-server, and the aggregator's `register` at start.

On a Redis Cluster the same is shown under the ACL in test_cluster_acl.py."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import RedisSettings, Settings
from fedasync.services.stores.claim_check import RedisClaimStore
from fedasync.services.stores.runs import create_run, list_runs
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import DEFAULT_RUN, RunSpec
from tests.integration.helpers import initial_state

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def keys_of(redis: aioredis.Redis, run: str) -> list[str]:
    found = [k async for k in redis.scan_iter(match="{" + run + "}:*")]
    found += [k async for k in redis.scan_iter(match=f"claim:{run}:*")]
    return sorted(k.decode() for k in found)


async def a_run(redis: aioredis.Redis, run: str, *, done: bool) -> None:
    """A run as its aggregator leaves it: spec, version, a ledger entry, a claim payload, and
    `{run}:done` if it ended."""
    keys = Keys(run)
    assert await create_run(redis, RunSpec(run))
    await redis.set(keys.version, 3)
    await redis.xadd(keys.ledger, {"d": b"x"})
    await RedisClaimStore(redis, run).put(run.encode() * 8)
    if done:
        await redis.hset(keys.done, mapping={"reason": "max_updates", "version": 3})


async def test_a_done_run_is_retired_and_nothing_else_is_touched(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    redis = connect(RedisSettings(url=redis_url))
    try:
        await a_run(redis, "over", done=True)
        await a_run(redis, "going", done=False)
        await a_run(redis, "over-2", done=True)  # a run whose id starts like the retired one's
        before = {run: await keys_of(redis, run) for run in ("going", "over-2")}
        assert len(await keys_of(redis, "over")) == 5  # run, version, ledger, done; a claim

        assert await asyncio.to_thread(main, ["runs", "retire", "over"]) == 0
        said = capsys.readouterr().out.strip()
        assert said == (
            "run over retired: 4 keys and 1 claim-check payloads deleted, and its directory entry"
        )
        assert await keys_of(redis, "over") == []
        assert await list_runs(redis, DEFAULT_RUN) == [DEFAULT_RUN, "going", "over-2"]
        assert {run: await keys_of(redis, run) for run in ("going", "over-2")} == before

        # refused in one line, exit 2, nothing deleted: a training run, the default run, a run
        # that is not there (any more), an id outside the grammar
        for run, why in (
            ("going", "run 'going' is training: only a done or stopped run is retired"),
            (DEFAULT_RUN, f"'{DEFAULT_RUN}' is the default run"),
            ("over", "no run 'over' in this deployment"),
            ("Bad Id", "is not a run id"),
        ):
            assert await asyncio.to_thread(main, ["runs", "retire", run]) == 2, run
            err = capsys.readouterr().err
            assert why in err, err
            assert len(err.strip().splitlines()) == 1, err  # no traceback
        assert await keys_of(redis, "going") == before["going"]
    finally:
        await redis.aclose()


async def test_a_stopped_run_is_retired_before_its_aggregator_closed_it(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    redis = connect(RedisSettings(url=redis_url))
    try:
        await a_run(redis, "halted", done=False)
        await redis.set(Keys("halted").policy, '{"version": 2, "stopped": true}')
        assert await asyncio.to_thread(main, ["runs", "retire", "halted"]) == 0
        assert await keys_of(redis, "halted") == []
    finally:
        await redis.aclose()


async def test_the_aggregator_lists_its_run_again_at_start(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A run that exists but lost its directory entry (a crash between spec and entry) is
    listed again once its aggregator starts (`register`, HSETNX: an entry there is kept)."""
    run = "relisted-run"
    assert await create_run(redis, RunSpec(run, created_at=1.0, created_by="op"))
    assert await redis.hdel(REGISTRY, run) == 1
    assert run not in await list_runs(redis, DEFAULT_RUN)
    mine = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"key_prefix": run})}
    )
    outcome = await run_aggregator(mine, redis=redis, burst=True, initial=initial_state(mine))
    assert outcome.version == 0
    assert run in await list_runs(redis, DEFAULT_RUN)
    await redis.delete(*[k async for k in redis.scan_iter(match="{" + run + "}:*")])
    await redis.hdel(REGISTRY, run)
