"""Devices without Redis credentials: workers publish signed updates through the ingest service,
and the aggregator (signatures required) applies them. All services real, on the linear task."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.ingest.service import run as run_ingest
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.device_keys import add_device
from fedasync.services.stores.ledger import verify
from fedasync.services.worker.service import run as run_worker
from fedasync.shared.keys import Keys
from tests.integration.helpers import dead_letters, ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEVICES = 3
UPDATES = 12


async def test_workers_publishing_through_ingest_are_applied(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    settings = settings.model_copy(
        update={
            "task": settings.task.model_copy(update={"num_devices": DEVICES}),
            "budget": settings.budget.model_copy(update={"max_updates": UPDATES}),
            "snapshot": settings.snapshot.model_copy(update={"port": 0}),
            "ingest": settings.ingest.model_copy(update={"port": 0}),
            "auth": settings.auth.model_copy(update={"required": True}),
        }
    )
    device_keys = [await add_device(redis, keys, f"device-{i}") for i in range(DEVICES)]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    snapshot_port: asyncio.Future[int] = loop.create_future()
    ingest_port: asyncio.Future[int] = loop.create_future()
    services = [
        asyncio.create_task(
            run_aggregator(settings, redis=redis, handle_signals=False, stopping=stopping)
        ),
        asyncio.create_task(
            run_snapshot(
                settings,
                redis=redis,
                handle_signals=False,
                stopping=stopping,
                started=snapshot_port,
            )
        ),
        asyncio.create_task(
            run_ingest(
                settings,
                redis=redis,
                handle_signals=False,
                stopping=stopping,
                started=ingest_port,
            )
        ),
    ]
    snapshot_url = f"http://127.0.0.1:{await snapshot_port}"
    ingest_url = f"http://127.0.0.1:{await ingest_port}"
    workers = []
    for device in range(DEVICES):
        mine = settings.model_copy(
            update={
                "worker": settings.worker.model_copy(
                    update={
                        "device_index": device,
                        "profile": "none",
                        "snapshot_url": snapshot_url,
                        "ingest_url": ingest_url,
                        "key": SecretStr(device_keys[device]),
                    }
                )
            }
        )
        # redis=None: the worker opens no Redis connection at all
        workers.append(run_worker(mine, handle_signals=False))
    try:
        results = await asyncio.wait_for(asyncio.gather(*workers), timeout=120)
    finally:
        stopping.set()
        outcome, *_ = await asyncio.gather(*services)

    assert outcome.closed == "max_updates"
    assert outcome.version == UPDATES
    assert all(r.done_reason == "max_updates" for r in results)
    assert sum(r.refused for r in results) == 0
    decisions = await ledger(redis, keys)
    applied = [d for d in decisions if d["outcome"] == "applied"]
    assert len(applied) == UPDATES
    assert {d["client_id"] for d in applied} <= {f"device-{i}" for i in range(DEVICES)}
    assert await dead_letters(redis, keys) == []  # every update was signed and verified
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
