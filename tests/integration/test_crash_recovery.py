"""kill -9 of the aggregator at random moments: nothing lost, nothing applied twice.

The aggregator runs as a real process; it is killed several times while updates (some of them
re-published duplicates) keep arriving, restarted each time, and finally drained. Then, in the
manner of Jepsen's total-queue check (services/stores/exactly_once.py, as the chaos harness and
the load benchmark run it): every published update has exactly one terminal decision, versions
are contiguous, and replaying the ledger reproduces the committed model bit for bit, and the
committed state byte for byte.

Once in FedAsync and once in the memory mode, whose per-client memory is written to Redis client
by client by each commit (`{p}:memory`) and read back at every restart: the replay from genesis
must arrive at the same memory, delta for delta. And once in FedBuff under multi-Krum, whose
buffered updates each checkpoint keeps (format 4): killed mid-buffer, it must go on choosing the
same updates as the replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.runtime.redis_conn import stream_entries
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.exactly_once import TERMINAL, Decided, check
from fedasync.services.stores.ledger import records, verify
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
KILLS = 8
WAVE = 60


def aggregator_process(settings: Settings, log: Path, mode: str) -> subprocess.Popen[bytes]:
    """`mode` is a policy mode, or `mode+rule` for a buffered mode under a robust rule."""
    mode, _, rule = mode.partition("+")
    env = dict(os.environ)
    env.update(
        {
            "FEDASYNC_REDIS__URL": str(settings.redis.url),
            "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
            "FEDASYNC_TASK__NAME": settings.task.name,
            "FEDASYNC_AGGREGATOR__BATCH_MAX": "8",
            "FEDASYNC_AGGREGATOR__PORT": "0",
            "FEDASYNC_AGGREGATOR__BATCH_MS": "5",
            "FEDASYNC_AGGREGATOR__BLOCK_MS": "100",
            "FEDASYNC_BUDGET__MAX_UPDATES": "100000",
            "FEDASYNC_POLICY__TAU_MAX": "1000",  # keep most updates applied: more state to lose
            "FEDASYNC_POLICY__MODE": mode,
        }
        | ({"FEDASYNC_POLICY__ROBUST": rule} if rule else {})
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fedasync.services.aggregator"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


async def publish_wave(
    redis: aioredis.Redis, keys: Keys, size: int, published: list[str], rng: np.random.Generator
) -> None:
    """A wave of updates from 12 devices, trained from recent versions; every 7th sent twice."""
    version = int(await redis.get(keys.version) or 0)
    for _ in range(WAVE):
        i = len(published)
        base = max(version - int(rng.integers(0, 6)), 0)
        update = Update(
            f"u{i}", f"device-{i % 12}", base, 10, rng.standard_normal(size).astype(np.float32)
        )
        raw = encode_update(update)
        await redis.xadd(keys.updates, stream_entry.build(raw))
        published.append(update.update_id)
        if i % 7 == 0:
            await redis.xadd(
                keys.updates, stream_entry.build(raw)
            )  # a retry after a lost acknowledgement


@pytest.mark.parametrize("mode", ["fedasync", "memory", "fedbuff+multi_krum"])
async def test_kill_9_at_random_moments_loses_and_duplicates_nothing(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path, mode: str
) -> None:
    keys = Keys(settings.redis.key_prefix)
    size = get_task(settings.task.name).layout.size
    published: list[str] = []
    rng = np.random.default_rng(11)
    cursor = "0-0"
    for round_ in range(KILLS):
        await publish_wave(redis, keys, size, published, rng)
        process = aggregator_process(settings, tmp_path / "aggregator.log", mode)
        try:
            if round_ % 4 != 0:  # every 4th is killed during start-up, the others mid-stream
                cursor = await wait_for_ledger(redis, keys, cursor, int(rng.integers(1, WAVE)))
                # fault injection, not synchronisation: land the kill at a random instant of
                # the read → decide → commit cycle, not just after a commit
                await asyncio.sleep(float(rng.uniform(0, 0.01)))
        finally:
            process.kill()  # SIGKILL, at whatever instant it has reached
            process.wait()
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)

    ledger = [Decided.from_record(record) async for record in records(redis, keys)]
    entry_ids = [entry async for entry, _ in stream_entries(redis, keys.updates)]
    verdict = check(set(published), set(published), ledger, entry_ids)
    terminal = sum(n for outcome, n in verdict.outcomes.items() if outcome in TERMINAL)
    print(
        f"kills={KILLS} published={len(published)} entries={len(entry_ids)} "
        f"decisions={len(ledger)} {dict(verdict.outcomes)} terminal={terminal} "
        f"lost={len(verdict.lost)} doubled={len(verdict.duplicated)}"
    )
    assert verdict.lost == []
    assert verdict.duplicated == []
    assert verdict.unexpected == []
    # one decision per stream entry, duplicates included
    assert verdict.redecided == verdict.undecided == []
    assert verdict.version_gaps == []  # applied versions are 1, 2, 3, … with no gap
    assert verdict.ok
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.model_matches
    assert report.state_matches
    policy = json.loads(await redis.get(keys.policy))
    mode, _, rule = mode.partition("+")
    assert policy["mode"] == mode  # the drain above ran on the policy the first start stored
    if rule:  # the rule decided: steps that left updates out, as the replay did
        assert policy["robust"] == rule
        excluded = [r async for r in records(redis, keys) if r.get("excluded")]
        assert len(excluded) == report.version
    if mode == "memory":  # all 12 devices remembered, each delta as the replay computed it
        assert report.remembered == 12
        assert await redis.hlen(keys.memory) == 12
