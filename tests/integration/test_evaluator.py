"""The evaluator against a real aggregator, snapshot service and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from learning.tasks import get_task
from services import evaluations
from services.aggregator.service import run as run_aggregator
from services.evaluations import FIELD, EvaluationRecord
from services.evaluator.service import run as run_evaluator
from services.keys import Keys
from services.redis_conn import get_bytes
from services.snapshot.service import run as run_snapshot
from shared.model_format import decode_model
from shared.seeds import Stream, stream
from shared.settings import Settings
from shared.update import Update
from shared.wire import encode_update
from tests.integration.helpers import wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def system(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[Settings]:
    """A running aggregator and snapshot service; yields settings pointing at the snapshot."""
    settings = settings.model_copy(
        update={"snapshot": settings.snapshot.model_copy(update={"port": 0})}
    )
    stopping = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    tasks = [
        asyncio.create_task(
            run_aggregator(settings, redis=redis, handle_signals=False, stopping=stopping)
        ),
        asyncio.create_task(
            run_snapshot(
                settings, redis=redis, handle_signals=False, stopping=stopping, started=started
            )
        ),
    ]
    port = await started
    url = f"http://127.0.0.1:{port}"
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
        await redis.xadd(keys.updates, {"m": encode_update(update)})


async def next_record(
    redis: aioredis.Redis, keys: Keys, after: str
) -> tuple[str, EvaluationRecord]:
    """Block on the evaluations stream (no polling) for the next record after `after`."""
    reply: Any = await redis.xread({keys.evaluations: after}, block=20_000, count=1)
    if not reply:
        raise TimeoutError("no evaluation recorded within 20 s")
    entry_id, fields = reply[0][1][0]
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
        assert "fedasync_evaluator_evaluations_total 2.0" in text
        assert "fedasync_evaluator_skipped_versions_total 6.0" in text
        assert "fedasync_evaluator_version 11.0" in text
    finally:
        stopping.set()
        await evaluator
    assert [r.version for r in await evaluations.all_records(redis, keys)] == [3, 10, 11]
