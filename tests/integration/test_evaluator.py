"""The evaluator against a real aggregator, snapshot service and Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fedasync.learning.task_failure import TaskCodeError
from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.evaluator.service import BACKGROUND, FOLLOWER, create_app
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.runtime.own_run import own_run
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import FIELD, EvaluationRecord
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import ModelSnapshot
from fedasync.shared.keys import Keys
from fedasync.shared.layout import Layout
from fedasync.shared.model_format import decode_model, encode_model
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.snapshot_protocol import MODEL_CONTENT_TYPE, VERSION_HEADER, latest_path
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import next_entries, start_snapshot, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def system(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[Settings]:
    """A running aggregator and snapshot service; yields settings pointing at the snapshot."""
    stopping = asyncio.Event()
    aggregator = asyncio.create_task(
        run_aggregator(settings, redis=redis, handle_signals=False, stopping=stopping)
    )
    snapshot, url = await start_snapshot(settings, redis, stopping)
    tasks = [aggregator, snapshot]
    yield settings.model_copy(
        update={
            "evaluator": settings.evaluator.model_copy(
                update={"snapshot_url": url, "port": 0, "wait_s": 1.0}
            )
        }
    )
    stopping.set()
    await asyncio.gather(*tasks)


async def publish_updates(redis: aioredis.Redis, keys: Keys, count: int, first: int = 0) -> None:
    size = get_task("linear").layout.size
    rng = np.random.default_rng(7)
    for i in range(first, first + count):
        weights = rng.standard_normal(size).astype(np.float32)
        update = Update(f"u{i}", f"c{i % 3}", first, 10, weights)
        await redis.xadd(keys.updates, stream_entry.build(encode_update(update)))


async def next_record(
    redis: aioredis.Redis, keys: Keys, after: str
) -> tuple[str, EvaluationRecord]:
    """Block on the evaluations stream (no polling) for the next record after `after`."""
    entry_id, fields = (await next_entries(redis, keys.evaluations, after, 20.0, count=1))[0]
    return entry_id.decode(), EvaluationRecord.from_json(fields[FIELD.encode()])


async def test_evaluator_resumes_scores_the_newest_version_and_follows(
    system: Settings, redis: aioredis.Redis
) -> None:
    settings = system
    keys = Keys(settings.redis.key_prefix)
    await publish_updates(redis, keys, 10)
    await wait_for_ledger(redis, keys, "0-0", 10)
    assert int(await redis.get(keys.version) or 0) == 10
    # An earlier evaluator run recorded version 3, then stopped while versions went on to 10.
    earlier = EvaluationRecord(3, 1.0, 1.0, 0.5, 0.5, 10)
    after = (await evaluations.append(redis, keys, earlier, keep=1000)).decode()

    stopping = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    evaluator = asyncio.create_task(
        run_evaluator(
            settings, redis=redis, handle_signals=False, stopping=stopping, started=started
        )
    )
    port = await started
    try:
        after, record = await next_record(redis, keys, after)
        # It resumed after 3 and went straight to the newest version, skipping 4 … 9.
        assert record.version == 10
        raw = await get_bytes(redis, keys.model(10))
        assert raw is not None
        task = get_task("linear")
        _, test = task.dataset(stream(settings.task.seed, Stream.DATA))
        expected = task.evaluate(decode_model(raw).snapshot.weights, test)
        assert record.score == pytest.approx(expected.score, rel=1e-6)
        assert record.loss == pytest.approx(expected.loss, rel=1e-6)
        assert record.num_samples == len(test)

        await publish_updates(redis, keys, 1, first=10)  # one more commit: it follows
        after, record = await next_record(redis, keys, after)
        assert record.version == 11

        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            text = await response.text()
        run = f'{{run="{settings.redis.key_prefix}"}}'  # every figure labelled with its run
        assert f"fedasync_evaluator_evaluations_total{run} 2.0" in text
        assert f"fedasync_evaluator_skipped_versions_total{run} 6.0" in text
        assert f"fedasync_evaluator_version{run} 11.0" in text
    finally:
        stopping.set()
        await evaluator
    assert [r.version for r in await evaluations.all_records(redis, keys)] == [3, 10, 11]


class ScriptedSnapshots:
    """A snapshot service serving scripted bodies: each long-poll gets the next version after
    `newer_than`, or waits out its `wait` if there is none. Records what it was asked."""

    def __init__(self, bodies: dict[int, bytes]) -> None:
        self.bodies = bodies
        self.asked: list[int] = []
        #: set once a long-poll asked for versions newer than the key: the follower is done with
        #: everything up to it (scored and recorded, or passed over)
        self.asked_after: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.closing = asyncio.Event()

    async def latest(self, request: web.Request) -> web.Response:
        than = int(request.query["newer_than"])
        self.asked.append(than)
        self.asked_after[than].set()
        newer = sorted(v for v in self.bodies if v > than)
        if not newer:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), float(request.query["wait"]))
            return web.Response(status=204)
        version = newer[0]
        return web.Response(
            body=self.bodies[version],
            content_type=MODEL_CONTENT_TYPE,
            headers={VERSION_HEADER: str(version)},
        )


def model_bytes(version: int, size: int) -> bytes:
    weights = np.random.default_rng(version).standard_normal(size).astype(np.float32)
    return encode_model(ModelSnapshot(version, weights, Layout.flat(size)), created_at=1.0)


@pytest_asyncio.fixture
async def scripted(settings: Settings) -> AsyncIterator[tuple[ScriptedSnapshots, Settings]]:
    """A scripted snapshot service: version 1 does not decode, 2 is not the task's model (one
    weight too many), 3 is fine; yields it and settings pointing the evaluator at it."""
    size = get_task("linear").layout.size
    snapshots = ScriptedSnapshots(
        {1: b"\x93not a model", 2: model_bytes(2, size + 1), 3: model_bytes(3, size)}
    )
    app = web.Application()
    # the route of the run the evaluator follows (its key prefix: a named run)
    app.router.add_get(latest_path(own_run(settings)), snapshots.latest)
    async with TestServer(app) as server:
        url = str(server.make_url("")).rstrip("/")
        update = {"snapshot_url": url, "port": 0, "wait_s": 1.0}
        yield (
            snapshots,
            settings.model_copy(update={"evaluator": settings.evaluator.model_copy(update=update)}),
        )
        snapshots.closing.set()


async def test_a_bad_model_is_counted_and_passed_over_and_the_evaluator_goes_on(
    scripted: tuple[ScriptedSnapshots, Settings], redis: aioredis.Redis
) -> None:
    snapshots, settings = scripted
    keys = Keys(settings.redis.key_prefix)
    async with TestClient(TestServer(create_app(settings, redis))) as client:
        # version 3 scored means versions 1 and 2 did not end the follower
        _, record = await next_record(redis, keys, "0-0")
        assert record.version == 3
        # the record is in Redis before the follower has taken the reply in: wait until it asks
        # for what comes after 3, so its own state says 3 as well
        await asyncio.wait_for(snapshots.asked_after[3].wait(), 20)
        metrics = await (await client.get("/metrics")).text()
        readiness = await client.get("/readyz")
        assert readiness.status == 200
        assert (await readiness.json())["evaluated"] == 3
    # each bad version was asked for once, then passed over: no tight loop on the same bytes
    assert snapshots.asked[:3] == [-1, 1, 2]
    assert set(snapshots.asked[3:]) <= {3}
    run = f'run="{settings.redis.key_prefix}"'
    assert f'fedasync_evaluator_failures_total{{reason="decode",{run}}} 1.0' in metrics
    assert f'fedasync_evaluator_failures_total{{reason="weights",{run}}} 1.0' in metrics
    assert f'fedasync_evaluator_failures_total{{reason="fetch",{run}}} 0.0' in metrics
    assert f"fedasync_evaluator_skipped_versions_total{{{run}}} 0.0" in metrics  # not skipped
    assert [r.version for r in await evaluations.all_records(redis, keys)] == [3]


async def test_readyz_is_503_once_the_follower_has_died(
    scripted: tuple[ScriptedSnapshots, Settings],
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, settings = scripted
    app = create_app(settings, redis)

    async def broken(session: aiohttp.ClientSession) -> None:
        raise RuntimeError("follower bug")

    monkeypatch.setattr(app[FOLLOWER], "run", broken)
    async with TestClient(TestServer(app)) as client:
        task = app[BACKGROUND].task
        assert task is not None
        await asyncio.wait([task])
        response = await client.get("/readyz")
        assert response.status == 503
        body = await response.json()
        assert body["error"] == "task follow-versions failed: RuntimeError: follower bug"
        assert (await client.get("/livez")).status == 200  # alive, but not doing its work
    # and shutting down says so in the log as well
    assert "task follow-versions failed" in caplog.text


async def test_a_task_whose_evaluate_fails_ends_the_evaluator_with_one_line(
    system: Settings, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the follower died with a traceback and the evaluator stayed up, never ready,
    until `fedasync up` gave up on it 60 s later with the log's tail."""

    def evaluate(self: object, weights: np.ndarray, data: object) -> None:
        raise ZeroDivisionError("division by zero")  # the user's own line

    monkeypatch.setattr(type(get_task("linear")), "evaluate", evaluate)
    stopping = asyncio.Event()
    with pytest.raises(TaskCodeError) as raised:  # it ends on its own: nobody sets `stopping`
        await asyncio.wait_for(
            run_evaluator(system, redis=redis, handle_signals=False, stopping=stopping), 60
        )
    line = evaluate.__code__.co_firstlineno + 1
    assert str(raised.value) == (
        f"task 'linear': its evaluate failed at {__file__}:{line} (in evaluate): "
        "ZeroDivisionError: division by zero"
    )
    assert "raise ZeroDivisionError" in raised.value.details
