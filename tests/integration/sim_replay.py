"""A simulation replayed through the real aggregator (test helper): what the simulator's devices
submitted, published to a run's stream in the order the simulator decided it, and decided by the
aggregator service against a real Redis, so a test can hold the two to the same bytes.

The aggregator starts from version 0 of the task and seed (as the simulator's world does) and,
when the policy has differential privacy on, with the simulator's noise secret
(`simulated_dp_secret` of the config's seed) as the run's: the one input a service run would
otherwise draw at random.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.aggregator.service import Aggregator
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.shared.decision import Decision
from fedasync.shared.keys import Keys
from fedasync.shared.policy import START
from fedasync.shared.seeds import simulated_dp_secret
from fedasync.shared.update import Update
from fedasync.sim.config import SimConfig
from fedasync.sim.result import RunResult
from fedasync.sim.runner import simulate
from tests.integration.helpers import publish


@dataclass(frozen=True, slots=True)
class Simulated:
    """A simulation of one algorithm: its config, each update submitted with the core's
    decision, in decision order, and the run's result (its final model among them)."""

    config: SimConfig
    submitted: list[tuple[Update, Decision]]
    result: RunResult

    def policy(self) -> dict[str, Any]:
        """The policy the simulation ran, as the aggregator's start settings (its START
        fields: the version and the runtime fields are not settings)."""
        return {k: v for k, v in self.result.settings.items() if k in START}


def simulated(config: SimConfig) -> Simulated:
    """`config` (one algorithm) simulated, with every decision kept."""
    submitted: list[tuple[Update, Decision]] = []
    sim = simulate(
        config, on_decision=lambda update, decision: submitted.append((update, decision))
    )
    (result,) = sim.results
    return Simulated(config, submitted, result)


def service_settings(url: str, prefix: str, task: dict[str, Any], policy: Any) -> Settings:
    """The aggregator's settings for a replay: its own key prefix on the test's server, the
    simulation's task and policy, and batches short enough to decide the burst quickly."""
    return load_settings(
        redis={"url": url, "key_prefix": prefix, "socket_timeout_s": 5.0},
        task=task,
        policy=policy,
        aggregator={"batch_ms": 20, "block_ms": 100, "port": 0},
    )


async def decided_by_the_aggregator(
    settings: Settings, redis: aioredis.Redis, sim: Simulated, *, restart: bool
) -> Aggregator:
    """The simulation's updates decided by the aggregator of `settings`' run, in burst mode: in
    one start, or (`restart`) half of them, then a second start for the rest (which restores
    the first's checkpoint). The aggregator of the last start, its state at the end."""
    keys = Keys(settings.redis.key_prefix)
    if settings.policy.to_policy().private:
        await redis.set(keys.dp_secret, simulated_dp_secret(sim.config.seed))
    cut = len(sim.submitted) // 2 if restart else len(sim.submitted)
    aggregator: Aggregator | None = None
    for phase in (sim.submitted[:cut], sim.submitted[cut:]):
        if not phase:
            continue
        for update, _ in phase:
            await publish(redis, keys, update)
        aggregator = Aggregator(settings, redis, keys)
        await aggregator.start(None)  # version 0 from the task and seed, or restored
        await aggregator.run(asyncio.Event(), burst=True)
    assert aggregator is not None, "the simulation submitted nothing"
    return aggregator
