"""kill -9 of a DP aggregator: the participation cap and the privacy budget survive it.

The aggregator runs as a real process, with differential privacy on, a per-device participation
cap and a privacy budget; it is killed with SIGKILL mid-stream and again during a start-up, then
restarted until the stream is decided. What it decided must be, record for record, what one
aggregator that was never killed decides from the same updates with the same noise secret: the
same updates dropped for the cap (each device's count of contributions restored, never reset
to zero), training closed by the budget at the same update (the ε spent restored, never
started again), the same ε in every record; and `ledger verify` reproduces it.

The budget is taken from a first run without one (the middle one of the sampled ε values it goes
through), so the test holds whatever the accountant's figures are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.dp_secret import SECRET_BYTES
from fedasync.services.stores.ledger import verify
from fedasync.shared import stream_entry
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import decided, ledger, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 4
#: contributions each device may make (the conservative model's cap)
CAP = 6
#: device-0 sends this many first (CAP of them applied, the rest dropped), then all take turns
EAGER = 10
ROUNDS = 10
SECRET = bytes(range(7, 7 + SECRET_BYTES))
#: DP on: FedAsync, clip C = 1, noise z = 2, the population for the sampled ε, the budget
#: counted under the sampled model (the conservative ε stops growing once every device is at
#: its cap); τ_max high, as every update is trained from version 0
DP: dict[str, Any] = {
    "dp_clip": 1.0,
    "dp_noise": 2.0,
    "dp_population": DEVICES,
    "dp_participation": CAP,
    "privacy_model": "sampled",
    "tau_max": 1000,
}


def with_policy(settings: Settings, suffix: str, **policy: Any) -> Settings:
    redis = settings.redis.model_copy(update={"key_prefix": f"{settings.redis.key_prefix}{suffix}"})
    budget = settings.budget.model_copy(update={"max_updates": 100_000})
    return settings.model_copy(
        update={"redis": redis, "budget": budget, "policy": type(settings.policy)(**policy)}
    )


def env_of(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env.update(
        {
            "FEDASYNC_REDIS__URL": str(settings.redis.url),
            "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
            "FEDASYNC_TASK__NAME": settings.task.name,
            "FEDASYNC_AGGREGATOR__BATCH_MAX": "4",
            "FEDASYNC_AGGREGATOR__PORT": "0",
            "FEDASYNC_AGGREGATOR__BATCH_MS": "5",
            "FEDASYNC_AGGREGATOR__BLOCK_MS": "100",
            "FEDASYNC_BUDGET__MAX_UPDATES": "100000",
        }
    )
    policy = settings.policy.to_policy()
    for name, value in DP.items():
        env[f"FEDASYNC_POLICY__{name.upper()}"] = str(value)
    if policy.privacy_budget is not None:
        env["FEDASYNC_POLICY__PRIVACY_BUDGET"] = repr(policy.privacy_budget)
    return env


def updates(size: int) -> list[Update]:
    """device-0's eager burst, then every device in turn; each trained from version 0."""
    rng = np.random.default_rng(27)
    order = ["device-0"] * EAGER + [f"device-{d}" for _ in range(ROUNDS) for d in range(DEVICES)]
    return [
        Update(f"u{i}", client, 0, 10, rng.standard_normal(size).astype(np.float32))
        for i, client in enumerate(order)
    ]


async def publish_all(redis: aioredis.Redis, keys: Keys, batch: list[Update]) -> None:
    await redis.set(keys.dp_secret, SECRET)  # the same noise in every run of this test
    for update in batch:
        await redis.xadd(keys.updates, stream_entry.build(encode_update(update)))


async def reference(settings: Settings, redis: aioredis.Redis, batch: list[Update]) -> list[Any]:
    """One aggregator, never killed, in burst mode: the ledger it commits."""
    keys = Keys(settings.redis.key_prefix)
    await publish_all(redis, keys, batch)
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    return await ledger(redis, keys)


def aggregator_process(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fedasync.services.aggregator"],
            cwd=ROOT,
            env=env_of(settings),
            stdout=out,
            stderr=out,
        )


def killed(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, and proof that it was what ended the process."""
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


async def test_the_participation_cap_and_the_privacy_budget_survive_kill_9(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    size = get_task(settings.task.name).layout.size
    batch = updates(size)
    # the budget: the middle one of the sampled ε values a run without one goes through
    unbounded = await reference(with_policy(settings, "-a", **DP), redis, batch)
    assert all(r["epsilon_sampled"] is not None for r in unbounded)
    spent = sorted({float(r["epsilon_sampled"]) for r in unbounded})
    assert len(spent) >= 3, spent
    budget = spent[len(spent) // 2]
    assert 0 < budget < spent[-1]

    bounded = with_policy(settings, "-b", **DP, privacy_budget=budget)
    expected = decided(await reference(bounded, redis, batch))
    # the reference exercises both: device-0 capped in its burst, and a close by the budget
    capped = [r["update_id"] for r in expected if r["reason"] == "participation_cap"]
    assert capped[: EAGER - CAP] == [f"u{i}" for i in range(CAP, EAGER)]
    applied = Counter(r["client_id"] for r in expected if r["outcome"] == "applied")
    assert applied["device-0"] == CAP
    assert max(applied.values()) <= CAP
    closed = [r for r in expected if r["reason"] == "closed"]
    assert closed, "the budget never closed training"
    assert {r["detail"] for r in closed} == {"privacy_budget"}

    killed_run = with_policy(settings, "-c", **DP, privacy_budget=budget)
    keys = Keys(killed_run.redis.key_prefix)
    await publish_all(redis, keys, batch)
    log = tmp_path / "aggregator.log"
    # 1: killed mid-stream, after device-0's burst (its count of contributions committed)
    process = aggregator_process(killed_run, log)
    try:
        cursor = await wait_for_ledger(redis, keys, "0-0", EAGER + 2)
    finally:
        killed(process)
    so_far = len(await ledger(redis, keys))
    assert so_far < len(batch), "nothing left to decide after the kill"
    # 2: killed at once, during a start-up
    process = aggregator_process(killed_run, log)
    killed(process)
    # 3: runs until everything is decided, then killed too
    process = aggregator_process(killed_run, log)
    try:
        await wait_for_ledger(redis, keys, cursor, len(batch) - EAGER - 2)
    finally:
        killed(process)
    await run_aggregator(killed_run, redis=redis, handle_signals=False, burst=True)

    recorded = decided(await ledger(redis, keys))
    assert len(recorded) == len(batch)
    assert recorded == expected  # the same caps, the same close, the same ε, the same model
    done: Any = await redis.hgetall(keys.done)
    assert done[b"reason"] == b"privacy_budget"
    report = await verify(redis, keys, killed_run.wire.max_message_bytes)
    assert report.ok, report.describe()
