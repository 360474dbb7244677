"""Devices training with DP-SGD, all real: each update carries the device's ε over the wire, the
aggregator records it beside the decision, `up`'s summary gives the fleet's worst, and the ledger
still verifies (the reported ε is context, not something the core decides)."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from opacus.accountants import RDPAccountant

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.up.summary import summarize
from fedasync.services.runtime.settings import Settings, SettingsError
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.ledger import records, verify
from fedasync.services.worker.device import build_device
from fedasync.services.worker.service import run as run_worker
from fedasync.shared.keys import Keys
from tests.integration.helpers import next_entries

pytestmark = pytest.mark.integration

DEVICES = 2
NOISE, CLIP, DELTA = 1.0, 1.0, 1e-4
UPDATES = 6


def epsilon_after(samples: int, batch_size: int, epochs: int, runs: int) -> float:
    per_epoch = math.ceil(samples / batch_size)
    accountant = RDPAccountant()
    accountant.history = [(NOISE, 1 / per_epoch, runs * epochs * per_epoch)]
    return float(accountant.get_epsilon(delta=DELTA))


def private(settings: Settings, device: int, url: str = "http://127.0.0.1:1") -> Settings:
    return settings.model_copy(
        update={
            "worker": settings.worker.model_copy(
                update={
                    "device_index": device,
                    "profile": "none",
                    "snapshot_url": url,
                    "epochs": 1,
                    "dpsgd_noise_multiplier": NOISE,
                    "dpsgd_max_grad_norm": CLIP,
                    "dpsgd_delta": DELTA,
                }
            )
        }
    )


@pytest.mark.asyncio
async def test_each_update_carries_the_devices_growing_epsilon_to_the_ledger_and_summary(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(
        update={
            "task": settings.task.model_copy(
                update={"name": "digits", "num_devices": DEVICES, "seed": 3}
            ),
            "budget": settings.budget.model_copy(update={"max_updates": UPDATES}),
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
    url = f"http://127.0.0.1:{await started}"
    workers = [
        run_worker(private(settings, d, url), redis=redis, handle_signals=False)
        for d in range(DEVICES)
    ]
    keys = Keys(settings.redis.key_prefix)
    try:
        results = await asyncio.wait_for(asyncio.gather(*workers), timeout=240)
    finally:
        stopping.set()
        outcome = await aggregator
        await snapshot
    assert outcome.closed == "max_updates"
    assert all(r.published >= 1 for r in results)

    ledger = [r async for r in records(redis, keys)]
    assert len(ledger) >= UPDATES
    by_client: defaultdict[str, list[float]] = defaultdict(list)
    for record in ledger:
        assert record["device_delta"] == DELTA
        by_client[record["client_id"]].append(record["device_epsilon"])
    assert len(by_client) == DEVICES
    for device in range(DEVICES):
        mine = private(settings, device)
        built = build_device(mine.task, mine.worker)
        client = f"device-{device}"
        # a device publishes one update at a time, so its records are its runs 1, 2, ... in order
        expected = [
            epsilon_after(len(built.data), built.train.batch_size, built.train.epochs, k)
            for k in range(1, len(by_client[client]) + 1)
        ]
        assert by_client[client] == expected
        assert expected == sorted(expected)

    summary = summarize(
        ledger, [], ended_by="max_updates", dead_letters=0, started_at=None, wall_seconds=1.0
    )
    worst = max(e for values in by_client.values() for e in values)
    assert summary["device_privacy"]["worst_epsilon"] == worst
    assert summary["device_privacy"]["delta"] == DELTA
    assert summary["device_privacy"]["devices_reporting"] == DEVICES

    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()


def test_a_device_whose_model_opacus_cannot_train_is_refused_in_one_line(
    settings: Settings,
) -> None:
    settings = settings.model_copy(
        update={
            "task": settings.task.model_copy(
                update={"name": "tests.learning.torch_models:QuadrantTask", "num_devices": 2}
            )
        }
    )
    mine = private(settings, 0)
    with pytest.raises(SettingsError) as info:
        build_device(mine.task, mine.worker)
    assert "ModuleValidator.fix" in str(info.value)
    assert "FEDASYNC_WORKER__DPSGD" in str(info.value)


@pytest.mark.asyncio
async def test_a_restarted_worker_with_a_state_file_goes_on_counting_its_epsilon(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    """Two runs of one worker process (2 updates each) over one state file: the ledger holds
    the ε of its runs 1 to 4, not 1, 2, 1, 2."""
    settings = settings.model_copy(
        update={
            "task": settings.task.model_copy(
                update={"name": "digits", "num_devices": DEVICES, "seed": 3}
            ),
            "budget": settings.budget.model_copy(update={"max_updates": 100}),
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
    mine = private(settings, 0, f"http://127.0.0.1:{await started}")
    mine = mine.model_copy(
        update={
            "worker": mine.worker.model_copy(
                update={"max_runs": 2, "dpsgd_state": str(tmp_path / "device-0.json")}
            )
        }
    )
    keys = Keys(settings.redis.key_prefix)
    try:
        for _ in range(2):  # the worker, then the worker restarted
            result = await asyncio.wait_for(
                run_worker(mine, redis=redis, handle_signals=False), timeout=120
            )
            assert result.published == 2
        ledger: list[dict[str, Any]] = []
        while len(ledger) < 4:  # the aggregator decides what was published: wait on the stream
            await next_entries(redis, keys.ledger, ledger[-1]["ledger_id"] if ledger else "0-0", 30)
            ledger = [r async for r in records(redis, keys)]
    finally:
        stopping.set()
        await aggregator
        await snapshot
    built = build_device(mine.task, mine.worker.model_copy(update={"dpsgd_state": None}))
    expected = [
        epsilon_after(len(built.data), built.train.batch_size, built.train.epochs, k)
        for k in range(1, 5)
    ]
    assert [r["device_epsilon"] for r in ledger] == expected
