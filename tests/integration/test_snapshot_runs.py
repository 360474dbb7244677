"""The snapshot service serving several runs at once: each run's models under
`/v1/runs/{run}/models/...`, with the legacy routes' ETags, 304s and long-polls, a run's new
version waking only its own long-polls, unknown and malformed run ids refused, at most
`snapshot.max_runs` runs held, every run's figures labelled `run`, and an evaluator following a
named run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.runtime.http_service import FAST_PATH
from fedasync.services.runtime.own_run import own_run
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.app import RUNS, create_app, refresh, wait_ready
from fedasync.services.stores import evaluations
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.runs import BAD_RUN_ID, UNKNOWN_RUN
from fedasync.shared.snapshot_protocol import VERSION_HEADER, latest_path
from fedasync.shared.update import Update
from tests.integration.helpers import (
    initial_state,
    make_update,
    next_entries,
    publish,
    start_snapshot,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: how long a test waits for an event: generous, no timing claim
DEADLINE_S = 60.0


def for_run(settings: Settings, run: str) -> Settings:
    """The settings of another run on the same Redis: its key prefix is its id."""
    return settings.model_copy(
        update={
            "redis": settings.redis.model_copy(update={"key_prefix": run}),
            "auth": settings.auth.model_copy(update={"default_run": settings.redis.key_prefix}),
        }
    )


async def commit(settings: Settings, redis: aioredis.Redis, ids: list[str]) -> None:
    """Version 0 of the settings' run (once), then one commit per id. The aggregator records
    the run's task in `{run}:run`, which is what makes the run exist for the service."""
    keys = Keys(settings.redis.key_prefix)
    if await redis.get(keys.version) is None:
        await run_aggregator(
            settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
        )
    for update_id in ids:
        version = int(await redis.get(keys.version) or 0)
        await publish(redis, keys, make_update(update_id, base=version, value=version + 1.0))
        await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)


@pytest.fixture
def runs(settings: Settings) -> tuple[str, str]:
    """Two named runs beside the default one (the settings' prefix), unique to the test."""
    prefix = settings.redis.key_prefix
    return f"{prefix}-a", f"{prefix}-b"


@pytest_asyncio.fixture
async def client(
    settings: Settings, redis: aioredis.Redis, runs: tuple[str, str]
) -> AsyncIterator[TestClient]:
    """The snapshot app; the default run at version 0, run a at version 2, run b at 1."""
    run_a, run_b = runs
    await commit(settings, redis, [])
    await commit(for_run(settings, run_a), redis, ["a1", "a2"])
    await commit(for_run(settings, run_b), redis, ["b1"])
    app = create_app(settings, redis)
    async with TestClient(TestServer(app)) as test_client:
        await wait_ready(app)
        yield test_client


def model(run: str, tail: str = "latest") -> str:
    return f"/v1/runs/{run}/models/{tail}"


async def test_each_run_has_its_own_latest_etag_and_304(
    client: TestClient, runs: tuple[str, str]
) -> None:
    run_a, run_b = runs
    a = await client.get(model(run_a))
    b = await client.get(model(run_b))
    assert (a.status, a.headers[VERSION_HEADER]) == (200, "2")
    assert (b.status, b.headers[VERSION_HEADER]) == (200, "1")
    assert decode_model(await a.read()).snapshot.version == 2
    assert a.headers["ETag"] != b.headers["ETag"]
    # each run's ETag revalidates its own latest only
    same = await client.get(model(run_a), headers={"If-None-Match": a.headers["ETag"]})
    assert (same.status, await same.read()) == (304, b"")
    crossed = await client.get(model(run_b), headers={"If-None-Match": a.headers["ETag"]})
    assert crossed.status == 200
    # versions and metadata of a run are that run's
    pinned = await client.get(model(run_a, "1"))
    assert pinned.status == 200
    assert pinned.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert decode_model(await pinned.read()).snapshot.version == 1
    assert (await client.get(model(run_b, "2"))).status == 404  # b has no version 2
    meta = await (await client.get(model(run_a, "latest/meta"))).json()
    assert (meta["version"], meta["etag"]) == (2, a.headers["ETag"])
    assert (await (await client.get(model(run_b, "1/meta"))).json())["version"] == 1
    # the same query rules as the legacy routes (an edge caches by URL)
    unknown_key = await client.get(model(run_a, "1") + "?zz=1")
    assert (unknown_key.status, (await unknown_key.json())["reason"]) == (400, "unknown_query_key")
    assert (await client.get(model(run_a, "1") + "?format=safetensors")).status == 200
    # the legacy routes are the default run's, also reachable by its id, the same bytes
    default = client.server.app[RUNS].default.id
    legacy = await client.get("/v1/models/latest")
    by_id = await client.get(model(default))
    assert legacy.headers[VERSION_HEADER] == by_id.headers[VERSION_HEADER] == "0"
    assert legacy.headers["ETag"] == by_id.headers["ETag"]
    assert await legacy.read() == await by_id.read()


async def test_a_new_version_of_one_run_wakes_only_that_runs_long_polls(
    client: TestClient, settings: Settings, redis: aioredis.Redis, runs: tuple[str, str]
) -> None:
    run_a, run_b = runs
    app = client.server.app
    await client.get(model(run_a))  # both runs held and followed
    await client.get(model(run_b))
    held = {run: app[RUNS].get(run) for run in runs}
    polls = {
        run_a: asyncio.create_task(client.get(model(run_a) + "?newer_than=2&wait=60")),
        run_b: asyncio.create_task(client.get(model(run_b) + "?newer_than=1&wait=60")),
    }
    for served in held.values():
        assert served is not None
        while served.cache.waiters == 0:  # the long-poll is parked in the run's cache
            await asyncio.sleep(0)
    await commit(for_run(settings, run_b), redis, ["b2"])
    woken = await asyncio.wait_for(polls[run_b], DEADLINE_S)
    assert (woken.status, woken.headers[VERSION_HEADER]) == (200, "2")
    assert decode_model(await woken.read()).snapshot.version == 2
    # run a's newest version is read again: nothing new there, its long-poll still waits
    served_a = held[run_a]
    assert served_a is not None
    await refresh(app, served_a)
    assert not polls[run_a].done()
    assert served_a.cache.waiters == 1
    await commit(for_run(settings, run_a), redis, ["a3"])
    answered = await asyncio.wait_for(polls[run_a], DEADLINE_S)
    assert (answered.status, answered.headers[VERSION_HEADER]) == (200, "3")
    timed_out = await client.get(model(run_b) + "?newer_than=2&wait=0")
    assert timed_out.status == 204


async def test_unknown_runs_are_404_and_ids_that_are_no_run_ids_400(
    client: TestClient, settings: Settings
) -> None:
    for tail in ("latest", "latest/meta", "0", "0/meta"):
        unknown = await client.get(model(f"{settings.redis.key_prefix}-nope", tail))
        assert unknown.status == 404, tail
        assert (await unknown.json())["reason"] == UNKNOWN_RUN
        for bad in ("Upper", "a%7Bb%7D", "-lead", "a:b", "a%20b", "x" * 64):
            refused = await client.get(URL(model(bad, tail), encoded=True))
            assert refused.status == 400, (bad, tail)
            assert (await refused.json())["reason"] == BAD_RUN_ID
    assert len(client.server.app[RUNS]) == 1  # none of them is held: only the default run


async def test_at_most_max_runs_are_held_and_one_more_is_a_503(
    settings: Settings, redis: aioredis.Redis, runs: tuple[str, str]
) -> None:
    run_a, run_b = runs
    await commit(settings, redis, [])
    for run in runs:
        await commit(for_run(settings, run), redis, [])
    two = settings.model_copy(
        update={"snapshot": settings.snapshot.model_copy(update={"max_runs": 2})}
    )
    app = create_app(two, redis)
    async with TestClient(TestServer(app)) as client:
        await wait_ready(app)
        assert (await client.get(model(run_a))).status == 200  # the default run and a: two
        refused = await client.get(model(run_b))
        assert (refused.status, refused.headers["Retry-After"]) == (503, "1")
        assert (await refused.json())["reason"] == "too_many_runs"
        assert (await client.get(model(run_a))).status == 200  # those held are served
        assert (await client.get("/v1/models/latest")).status == 200
        text = await (await client.get("/metrics")).text()
    assert "fedasync_snapshot_runs_refused_total 1.0" in text
    assert "fedasync_snapshot_runs 2.0" in text


async def test_every_runs_figures_carry_its_run_and_each_family_is_named_once(
    client: TestClient, runs: tuple[str, str]
) -> None:
    run_a, run_b = runs
    default = client.server.app[RUNS].default.id
    for run, times in ((run_a, 3), (run_b, 1)):
        for _ in range(times):
            assert (await client.get(model(run))).status == 200
    text = await (await client.get("/metrics")).text()
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names))  # one HELP and TYPE per family, not one per run
    assert text.count("# HELP fedasync_snapshot_requests_total ") == 1
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }

    def requests(run: str) -> float | None:
        labels = (("route", "latest"), ("run", run), ("status", "200"))
        return samples.get(("fedasync_snapshot_requests_total", labels))

    assert (requests(run_a), requests(run_b), requests(default)) == (3.0, 1.0, None)
    versions = {run: samples[("fedasync_snapshot_model_version", (("run", run),))] for run in runs}
    assert versions == {run_a: 2.0, run_b: 1.0}
    assert samples[("fedasync_snapshot_model_version", (("run", default),))] == 0.0
    # the process's own figures carry no run
    assert samples[("fedasync_snapshot_worker", (("worker", "0"),))] == 1.0
    assert samples[("fedasync_snapshot_runs", ())] == 3.0


async def test_the_fast_path_answers_a_held_run_and_leaves_others_to_aiohttp(
    client: TestClient, settings: Settings, runs: tuple[str, str]
) -> None:
    run_a, run_b = runs
    fast = client.server.app[FAST_PATH]

    def head(path: str) -> bytes:
        return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()

    assert fast.answer(head(model(run_a))) is None  # not held yet: the middleware checks it
    await client.get(model(run_a))
    assert fast.answer(head(model(run_a))) is not None
    assert fast.answer(head(model(run_a, "latest/meta"))) is not None
    assert fast.answer(head(model(run_b))) is None  # still not held
    for declined in (
        model(run_a, "1"),
        model(run_a) + "?newer_than=0",
        model(run_a.upper()),
        model(run_a, "latest/meta/x"),
        model(f"{settings.redis.key_prefix}-nope"),
        f"/v1/runs/{run_a}/models",
        f"/v1/runs/{run_a}",
    ):
        assert fast.answer(head(declined)) is None, declined


async def test_an_evaluator_follows_its_named_run_and_records_there(
    settings: Settings, redis: aioredis.Redis, runs: tuple[str, str]
) -> None:
    """The snapshot service's default run is the settings' prefix; the evaluator's prefix is
    run a, so it follows `/v1/runs/<a>/models/latest` and records run a's scores in run a's
    keys, none in the default run's."""
    run_a, _ = runs
    settings_a = for_run(settings, run_a)
    keys_a = Keys(run_a)
    size = get_task(settings.task.name).layout.size
    await run_aggregator(settings_a, redis=redis, handle_signals=False, burst=True)  # the task's
    for version in range(2):
        update = Update(f"a{version}", "c0", version, 10, np.full(size, 0.1, np.float32))
        await publish(redis, keys_a, update)
        await run_aggregator(settings_a, redis=redis, handle_signals=False, burst=True)
    assert own_run(settings_a) == run_a
    assert latest_path(own_run(settings_a)) == model(run_a)
    stopping = asyncio.Event()
    snapshot, url = await start_snapshot(settings, redis, stopping)
    evaluator_settings = settings_a.model_copy(
        update={
            "evaluator": settings.evaluator.model_copy(
                update={"snapshot_url": url, "port": 0, "wait_s": 1.0}
            )
        }
    )
    evaluator = asyncio.create_task(
        run_evaluator(evaluator_settings, redis=redis, handle_signals=False, stopping=stopping)
    )
    try:
        entries = await next_entries(redis, keys_a.evaluations, "0-0", DEADLINE_S, count=1)
        assert entries
        recorded = await evaluations.latest(redis, keys_a)
        assert recorded is not None
        assert recorded.version == 2  # run a's newest (the default run has no model at all)
        assert await evaluations.latest(redis, Keys(settings.redis.key_prefix)) is None
    finally:
        stopping.set()
        await asyncio.gather(snapshot, evaluator)
