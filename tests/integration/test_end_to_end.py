"""Aggregator + snapshot service + device workers, all real, on digits: the model learns."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import FIELD, EvaluationRecord
from fedasync.services.stores.ledger import verify
from fedasync.services.worker.service import run as run_worker
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.seeds import Stream, stream
from tests.integration.helpers import next_entries

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEVICES = 4


async def evaluation_of(redis: aioredis.Redis, keys: Keys, version: int) -> EvaluationRecord:
    """Block on the evaluations stream (no polling) until `version` has been scored."""
    after = "0-0"
    while True:
        for entry_id, fields in await next_entries(redis, keys.evaluations, after, 30.0):
            after = entry_id.decode()
            record = EvaluationRecord.from_json(fields[FIELD.encode()])
            if record.version >= version:
                return record


async def test_workers_train_digits_well_above_chance(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(
        update={
            "task": settings.task.model_copy(
                update={"name": "digits", "num_devices": DEVICES, "seed": 3}
            ),
            "budget": settings.budget.model_copy(update={"max_updates": 40}),
            "snapshot": settings.snapshot.model_copy(update={"port": 0}),
        }
    )
    stopping = asyncio.Event()
    aggregator = asyncio.create_task(
        run_aggregator(settings, redis=redis, handle_signals=False, stopping=stopping)
    )
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    snapshot = asyncio.create_task(
        run_snapshot(
            settings, redis=redis, handle_signals=False, stopping=stopping, started=started
        )
    )
    port = await started
    url = f"http://127.0.0.1:{port}"
    evaluator_settings = settings.model_copy(
        update={
            "evaluator": settings.evaluator.model_copy(
                update={"snapshot_url": url, "port": 0, "wait_s": 1.0}
            )
        }
    )
    evaluator = asyncio.create_task(
        run_evaluator(evaluator_settings, redis=redis, handle_signals=False, stopping=stopping)
    )
    workers = []
    for device in range(DEVICES):
        mine = settings.model_copy(
            update={
                "worker": settings.worker.model_copy(
                    update={"device_index": device, "profile": "none", "snapshot_url": url}
                )
            }
        )
        workers.append(run_worker(mine, redis=redis, handle_signals=False))
    keys = Keys(settings.redis.key_prefix)
    try:
        results = await asyncio.wait_for(asyncio.gather(*workers), timeout=240)
        final_record = await evaluation_of(redis, keys, 40)
    finally:
        stopping.set()
        outcome = await aggregator
        await snapshot
        await evaluator

    assert outcome.closed == "max_updates"
    assert outcome.version == 40
    assert all(r.done_reason == "max_updates" for r in results)
    assert sum(r.published for r in results) >= 40
    assert sum(r.not_modified for r in results) + sum(r.downloads for r in results) > 0

    raw = await get_bytes(redis, keys.model(40))
    assert raw is not None
    model = decode_model(raw).snapshot
    task = get_task("digits")
    _, test = task.dataset(stream(3, Stream.DATA))
    initial = task.evaluate(task.init_weights(stream(3, Stream.MODEL)), test)
    final = task.evaluate(model.weights, test)
    assert final.accuracy is not None
    assert final.accuracy > 0.6  # chance is 0.1
    assert initial.accuracy is not None
    assert final.accuracy > initial.accuracy + 0.3
    # The evaluator scored the final version exactly as scoring it here does, per class too.
    assert final_record.accuracy == pytest.approx(final.accuracy)
    assert final_record.per_class == {str(c): v for c, v in final.per_class.items()}
    curve = await evaluations.all_records(redis, keys)
    assert [r.version for r in curve] == sorted({r.version for r in curve})  # increasing
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
