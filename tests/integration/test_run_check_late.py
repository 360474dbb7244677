"""A worker or an evaluator started before the run is recorded still refuses another task.

They may start before the aggregator's first start (nothing in `{p}:run` yet) or while Redis is
away, so the comparison at start can find nothing to compare with. They compare again before
each write, a worker's update or the evaluator's record, until they have compared once
(services/stores/run_record.py `RunCheck`): nothing they write comes from another task, and the
evaluator's refusal, found by its background loop, ends the whole service (the entry point turns
it into one line and exit code 2), not only its /readyz.

Real parts: a Redis of the suite's own, the aggregator, the snapshot service, the worker and the
evaluator, each run in this process.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.runtime.settings import Settings, SettingsError
from fedasync.services.stores import evaluations
from fedasync.services.stores.run_record import RunCheck, recorded_task
from fedasync.services.worker.service import run as run_worker
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, start_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: the run's seed, and the one the late-checked process was started with
RUN_SEED, OTHER_SEED = 0, 5
REFUSAL = f"FEDASYNC_TASK__SEED: {OTHER_SEED} here, but this run's task has {RUN_SEED}"


def with_seed(settings: Settings, seed: int) -> Settings:
    return settings.model_copy(update={"task": settings.task.model_copy(update={"seed": seed})})


def late(settings: Settings, section: str, **values: object) -> Settings:
    """The late process's settings: OTHER_SEED, and its own section changed by `values`."""
    other = with_seed(settings, OTHER_SEED)
    part = getattr(other, section).model_copy(update=values)
    return other.model_copy(update={section: part})


@dataclass
class Snapshot:
    """A snapshot service with no model yet: no aggregator has started."""

    url: str
    stopping: asyncio.Event


@pytest_asyncio.fixture
async def snapshot(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[Snapshot]:
    stopping = asyncio.Event()
    task, url = await start_snapshot(settings, redis, stopping)
    yield Snapshot(url, stopping)
    stopping.set()
    await task


async def waiting_for_a_model(url: str) -> None:
    """Until a long-poll waits at the snapshot service for the first model (its metric: the
    service offers no event to await)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(1200):
            async with session.get(url + "/metrics") as response:
                text = await response.text()
            # (of the run asked for: each run's figures carry its `run`)
            if re.search(r'fedasync_snapshot_long_poll_waiters\{run="[^"]+"\} 1\.0', text):
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the worker never asked for a model")


async def refusal_once_the_run_starts(
    late: asyncio.Task[object], settings: Settings, redis: aioredis.Redis, snapshot: Snapshot
) -> str:
    """Start the run's aggregator (seed RUN_SEED: it records the run and commits version 0)
    while `late` runs with another seed; the refusal `late` ends with."""
    run = with_seed(settings, RUN_SEED)
    aggregator = asyncio.create_task(
        run_aggregator(run, redis=redis, handle_signals=False, stopping=snapshot.stopping)
    )
    try:
        with pytest.raises(SettingsError) as refused:
            await asyncio.wait_for(late, 120)
    finally:
        snapshot.stopping.set()
        await aggregator
    return str(refused.value)


async def test_a_worker_started_before_the_run_refuses_before_it_publishes(
    settings: Settings, redis: aioredis.Redis, snapshot: Snapshot
) -> None:
    keys = Keys(settings.redis.key_prefix)
    other = late(settings, "worker", device_index=0, profile="none", snapshot_url=snapshot.url)
    assert await recorded_task(redis, keys) is None  # nothing to compare with at its start
    worker = asyncio.create_task(run_worker(other, redis=redis, handle_signals=False))
    await waiting_for_a_model(snapshot.url)  # past its check at start, which found no run
    assert REFUSAL in await refusal_once_the_run_starts(worker, settings, redis, snapshot)
    assert await redis.xlen(keys.updates) == 0  # it trained on another task's data: not sent


async def test_an_evaluator_started_before_the_run_stops_the_service_before_it_records(
    settings: Settings, redis: aioredis.Redis, snapshot: Snapshot
) -> None:
    keys = Keys(settings.redis.key_prefix)
    other = late(settings, "evaluator", snapshot_url=snapshot.url, port=0, wait_s=1.0)
    stopping = asyncio.Event()  # never set: the refusal alone ends it
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    evaluator = asyncio.create_task(
        run_evaluator(other, redis=redis, handle_signals=False, stopping=stopping, started=started)
    )
    await started  # listening: its check at start found no run to compare with
    assert REFUSAL in await refusal_once_the_run_starts(evaluator, settings, redis, snapshot)
    assert await evaluations.latest(redis, keys) is None  # another task's score: not recorded


async def test_the_check_compares_once_and_only_against_a_recorded_run(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    check = RunCheck(redis, keys, settings.task)
    await check.ensure()
    assert not check.compared  # no run yet: it compares again at the next write
    await run_aggregator(  # records the run at its start
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    await check.ensure()
    assert check.compared
    # compared once, never read again: a task recorded otherwise now (which HSETNX never lets
    # happen within a run) goes unseen, where a second read would raise
    await redis.hset(keys.run, "task", '{"name": "linear", "params": {}, "seed": 9}')
    await check.ensure()
