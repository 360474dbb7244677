"""The supervisor keeps one aggregator per active run: started when the run is created,
restarted after a kill -9 while the other runs go on committing, stopped once the run is done.

Real parts: a private redis-server, the supervisor service in this process over real HTTP, and
its children as real `python -m fedasync.services.aggregator` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.runtime.run_settings import settings_for_run
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.runs import create_run
from fedasync.services.supervisor.service import run as run_supervisor
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import RunSpec, TaskSpec
from fedasync.shared.update import Update
from tests.integration.helpers import ledger, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: how long a child process may take to start or a commit to land on a loaded machine
PATIENCE_S = 120.0


async def until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `check` (a look at other processes: nothing here can be awaited) until truthy."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {PATIENCE_S:.0f} s: {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
def runs(settings: Settings) -> dict[str, RunSpec]:
    """Three runs of the linear task: two that train until stopped, one whose one-second time
    budget ends it at once."""
    stem = "sv-" + settings.redis.key_prefix.rsplit("-", 1)[1]
    endless = {"max_updates": 1_000_000, "max_seconds": 86_400.0}
    return {
        name: RunSpec(
            f"{stem}-{name}",
            TaskSpec("linear", seed=i),
            {"mode": "fedasync"},
            budget,
            created_at=time.time(),
            created_by="test",
        )
        for i, (name, budget) in enumerate(
            [("a", endless), ("b", endless), ("c", {"max_seconds": 1.0})]
        )
    }


@pytest_asyncio.fixture
async def supervisor(
    settings: Settings, redis: aioredis.Redis, runs: dict[str, RunSpec], tmp_path: Any
) -> AsyncIterator[str]:
    """The supervisor's base URL, with the three runs created; its children stopped after."""
    base = load_settings(
        redis=settings.redis.model_dump(),
        aggregator={"batch_ms": 20, "block_ms": 100, "host": "127.0.0.1"},
        supervisor={
            "port": 0,
            "poll_s": 0.2,
            "done_grace_s": 0.0,
            "restart_backoff_max_s": 2.0,
            "evaluators": False,
            "skip_default": True,
            "log_dir": str(tmp_path / "children"),
        },
    )
    for spec in runs.values():
        assert await create_run(redis, spec)
    stopping = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    service = asyncio.create_task(
        run_supervisor(base, stopping=stopping, started=started, handle_signals=False)
    )
    try:
        port = await asyncio.wait_for(started, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        stopping.set()
        await service
        for spec in runs.values():
            await redis.hdel(REGISTRY, spec.id)


def updates_for(settings: Settings, spec: RunSpec, first: int, count: int) -> list[Update]:
    """`count` updates of the run's model size (built from its task), based on version 0."""
    size = len(settings_for_run(settings, spec).task.build().init_weights(np.random.default_rng(0)))
    return [
        Update(f"u{i}", f"dev-{i % 3}", 0, 10, np.full(size, 0.01 * i, np.float32), created_at=1.0)
        for i in range(first, first + count)
    ]


async def test_one_aggregator_per_run_restarted_after_kill9_stopped_when_done(
    supervisor: str, settings: Settings, redis: aioredis.Redis, runs: dict[str, RunSpec]
) -> None:
    a, b, c = runs["a"], runs["b"], runs["c"]
    async with aiohttp.ClientSession() as http:

        async def children() -> dict[str, Any]:
            async with http.get(f"{supervisor}/v1/aggregators") as answer:
                assert answer.status == 200
                body: dict[str, Any] = await answer.json()
                return body["runs"]

        async def aggregator_of(run: str) -> dict[str, Any] | None:
            child = (await children()).get(run, {}).get("children", {}).get("aggregator")
            return child if child and child["running"] else None

        async def decided(spec: RunSpec, count: int) -> bool:
            return len(await ledger(redis, Keys(spec.id))) >= count

        # creating a run started its aggregator: each commits its genesis
        first_a = await until("run a's aggregator", lambda: aggregator_of(a.id))
        first_b = await until("run b's aggregator", lambda: aggregator_of(b.id))
        assert first_a["pid"] != first_b["pid"]
        for spec in (a, b):
            await until(f"{spec.id} training", lambda s=spec: redis.exists(Keys(s.id).version))

        # a done run's aggregator is stopped (run c's one-second budget ended it)
        async def c_stopped() -> bool:
            entry = (await children()).get(c.id, {})
            return entry.get("status") == "done" and not entry.get("children")

        await until("run c done and its aggregator stopped", c_stopped)
        assert (await redis.hgetall(Keys(c.id).done))[b"reason"] == b"max_seconds"

        for update in updates_for(settings, b, 0, 5):
            await publish(redis, Keys(b.id), update)
        await until("run b decided 5 updates", lambda: decided(b, 5))
        epoch_before = int(await redis.get(Keys(a.id).epoch))

        # kill -9 run a's aggregator: first prove it died
        os.kill(first_a["pid"], signal.SIGKILL)

        async def a_down_or_replaced() -> bool:
            child = (await children())[a.id]["children"]["aggregator"]
            return child["pid"] != first_a["pid"] or not child["running"]

        await until("run a's aggregator gone", a_down_or_replaced)
        # run b keeps committing while a is down and restarting
        for update in updates_for(settings, b, 5, 5):
            await publish(redis, Keys(b.id), update)
        await until("run b decided 10 updates", lambda: decided(b, 10))

        async def a_restarted() -> dict[str, Any] | None:
            child = await aggregator_of(a.id)
            return child if child and child["pid"] != first_a["pid"] else None

        second_a = await until("run a's aggregator restarted", a_restarted)
        assert second_a["restarts"] == 1
        assert second_a["last_exit"] == -signal.SIGKILL
        await until(
            "the restarted aggregator raised run a's epoch",
            lambda: _above(redis, Keys(a.id).epoch, epoch_before),
        )
        # ... and decides run a's updates
        for update in updates_for(settings, a, 0, 3):
            await publish(redis, Keys(a.id), update)
        await until("run a decided 3 updates", lambda: decided(a, 3))
        # run b's aggregator was never touched
        assert (await aggregator_of(b.id)) == {**first_b, "starts": 1}

        async with http.get(f"{supervisor}/metrics") as answer:
            text = await answer.text()
        assert f'fedasync_supervisor_restarts_total{{role="aggregator",run="{a.id}"}} 1.0' in text
        assert f'fedasync_supervisor_child_running{{role="aggregator",run="{b.id}"}} 1.0' in text


async def _above(redis: aioredis.Redis, key: str, value: int) -> bool:
    return int(await redis.get(key) or 0) > value
