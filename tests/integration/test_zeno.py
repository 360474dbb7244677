"""Zeno++ through the real aggregator: the updates a simulation submitted, with a third of its
devices sign-flipping, are decided by the aggregator exactly as the simulator decided them (the
same held-out set, the same validation gradient refreshed at the same versions), and
`ledger verify` given the same gradient replays the rejections."""

from __future__ import annotations

import asyncio
import os

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.deciding import zeno_gradient_source
from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import Keys
from tests.integration.helpers import decided, ledger
from tests.integration.sim_replay import (
    Simulated,
    decided_by_the_aggregator,
    service_settings,
    simulated,
)
from tests.sim.helpers import config

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TASK = {"name": "linear", "params": {"samples": 800}}
ZENO = {"tau_max": 100, "zeno_margin": 0.01, "zeno_every": 3}


def simulated_zeno() -> Simulated:
    """A simulation with sign-flippers and Zeno++: what it submitted, decided and ended with."""
    return simulated(
        config(
            task=TASK,
            fleet={"devices": 6, "latency": {"kind": "longtail"}},
            budget={"max_updates": 25},
            attack={"kind": "sign_flip", "share": 0.34},
            validation={"samples": 50},
            algorithms=[{"kind": "fedasync", **ZENO}],
        )
    )


@pytest.mark.parametrize("restart", [False, True], ids=["one-run", "restarted-midway"])
async def test_the_aggregator_decides_zeno_exactly_as_the_simulator(
    redis_server: RedisServer, restart: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarted midway, the aggregator restores v from its checkpoint and goes on scoring
    with it, as the simulator, which never stopped, did."""
    sim = simulated_zeno()
    submitted = sim.submitted
    assert any(d.reason == "zeno" for _, d in submitted)  # the attack met the defence
    assert any(d.applied for _, d in submitted)
    settings = service_settings(
        redis_server.url,
        f"t-zeno-parity-{restart}",
        {**TASK, "seed": 0, "validation_samples": 50},
        ZENO,
    )
    keys = Keys(settings.redis.key_prefix)
    redis: aioredis.Redis = connect(settings.redis)
    try:
        aggregator = await decided_by_the_aggregator(settings, redis, sim, restart=restart)
        recorded = decided(await ledger(redis, keys))
        assert recorded == [d.to_dict() for _, d in submitted]
        assert aggregator.state.weights_view().tobytes() == sim.result.weights.tobytes()
        report = await verify(
            redis,
            keys,
            settings.wire.max_message_bytes,
            gradient_at=zeno_gradient_source(settings.task),
        )
        assert report.ok, report.describe()
        # the command an admin runs: the run's recorded task, its own held-out size
        for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("FEDASYNC_REDIS__URL", redis_server.url)
        monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", settings.redis.key_prefix)
        monkeypatch.setenv("FEDASYNC_TASK__VALIDATION_SAMPLES", "50")
        assert await asyncio.to_thread(main, ["ledger", "verify"]) == 0
    finally:
        await redis.aclose()
