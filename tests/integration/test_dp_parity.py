"""Differential privacy through the real aggregator: the updates a DP simulation submitted are
decided by the aggregator service exactly as the simulator decided them (issue 27).

Given the simulator's noise secret as the run's (`{p}:dp-secret`), the aggregator clips each
delta to the same C (adapted the same way with `dp_quantile`), draws the same Gaussian noise at
each server step, drops the same updates at the participation cap and accounts the same ε: its
ledger is the simulator's decisions record for record, its model the simulator's byte for byte,
and `ledger verify` replays it. Restarted midway, it restores the clip, the ε spent and each
device's contributions from its checkpoint and reads the secret back, and still agrees.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import redis.asyncio as aioredis

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
DEVICES = 6
#: clip C, noise z, the population for the sampled ε, a cap the fastest devices reach
DP: dict[str, Any] = {
    "tau_max": 6,
    "dp_clip": 0.5,
    "dp_noise": 1.0,
    "dp_population": DEVICES,
    "dp_participation": 5,
}
#: adaptive clipping: the clip tracks the median norm; σ_b raised so that z < 2·σ_b holds
ADAPTIVE: dict[str, Any] = {"dp_quantile": 0.5, "dp_count_noise": 1.0, "dp_noise": 0.8}


#: the algorithms compared, by test id
ALGORITHMS: dict[str, dict[str, Any]] = {
    "dp-fedasync": {"kind": "fedasync", **DP},
    "dp-fedbuff": {"kind": "fedbuff", "buffer_size": 3, **DP},
    "dp-fedasync-adaptive": {"kind": "fedasync", **DP, **ADAPTIVE},
    "dp-fedbuff-adaptive": {"kind": "fedbuff", "buffer_size": 3, **DP, **ADAPTIVE},
}


@functools.cache
def simulation(name: str) -> Simulated:
    """The simulation of ALGORITHMS[name]: run once for both of its tests (its summary's PLD
    accounting is the slow part)."""
    return simulated(
        config(
            task=TASK,
            fleet={"devices": DEVICES, "latency": {"kind": "longtail"}},
            budget={"max_updates": 25},
            algorithms=[ALGORITHMS[name]],
        )
    )


@pytest.mark.parametrize("restart", [False, True], ids=["one-run", "restarted-midway"])
@pytest.mark.parametrize("name", ALGORITHMS)
async def test_the_aggregator_decides_dp_exactly_as_the_simulator(
    redis_server: RedisServer, name: str, restart: bool
) -> None:
    sim = simulation(name)
    submitted = sim.submitted
    # what the comparison covers: clipped deltas, capped devices, ε in every record
    assert any(d.applied for _, d in submitted)
    assert any(d.clipped for _, d in submitted)
    assert any(d.reason == "participation_cap" for _, d in submitted)
    assert all(d.epsilon_conservative is not None for _, d in submitted)
    assert all(d.epsilon_sampled is not None for _, d in submitted)
    settings = service_settings(
        redis_server.url,
        f"t-dp-parity-{name}-{restart}",
        {**TASK, "seed": sim.config.seed},
        sim.policy(),
    )
    policy = settings.policy.to_policy()
    assert policy.to_dict() == sim.result.settings  # the very policy the simulator ran
    keys = Keys(settings.redis.key_prefix)
    redis: aioredis.Redis = connect(settings.redis)
    try:
        aggregator = await decided_by_the_aggregator(settings, redis, sim, restart=restart)
        recorded = decided(await ledger(redis, keys))
        assert recorded == [d.to_dict() for _, d in submitted]
        state = aggregator.state
        assert state.weights_view().tobytes() == sim.result.weights.tobytes()
        assert dict(state.counters) == sim.result.counters
        # where the accountant ended (the summary's RDP figures) and the clip in force then
        spent = sim.result.privacy
        assert spent is not None
        assert state.privacy.epsilon(policy) == (
            spent["epsilon_sampled"],
            spent["epsilon_conservative"],
        )
        assert state.privacy.clip_norm(policy) == spent["clip"]
        report = await verify(redis, keys, settings.wire.max_message_bytes)
        assert report.ok, report.describe()
        assert report.replayed == len(submitted)
    finally:
        await redis.aclose()
