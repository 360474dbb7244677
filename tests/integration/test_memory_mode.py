"""The memory mode through the aggregator: switched on and off at runtime like FedBuff, its
per-client memory written to `{p}:memory` by the commits, restored by a restart, and replayed
by `ledger verify` delta for delta."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.services.stores.memory_store import read_memory
from fedasync.services.stores.policy_store import change_policy, read_policy
from fedasync.shared.decision import Outcome
from fedasync.shared.keys import Keys
from fedasync.shared.staleness import Decay
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def switch(redis: aioredis.Redis, keys: Keys, **changes: Any) -> None:
    """A policy change as the control service writes it (the aggregator reads it between
    batches)."""
    current = await read_policy(redis, keys)
    await change_policy(
        redis, keys, current.evolve(**changes), who="test", why="switch mode", at=1.0
    )


async def drain(settings: Settings, redis: aioredis.Redis, **kwargs: Any) -> None:
    await run(settings, redis=redis, handle_signals=False, burst=True, **kwargs)


async def test_switched_on_at_runtime_its_memory_is_committed_restored_and_replayed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    # FedAsync first: three versions
    for i in range(3):
        await publish(redis, keys, make_update(f"a{i}", base=i, value=1.0, client=f"c{i}"))
    await drain(settings, redis, initial=initial_state(settings))
    await switch(redis, keys, mode="memory", decay=Decay.CONSTANT, server_lr=0.5, buffer_size=2)
    # memory: updates from the current version (3) and one from an older base (dropped: the
    # base models start at the switch); a restart between the two halves
    for i, client in enumerate(["c0", "c1", "c2"]):
        await publish(redis, keys, make_update(f"m{i}", base=3, value=2.0 + i, client=client))
    await publish(redis, keys, make_update("old", base=1, value=9.0, client="c3"))
    await drain(settings, redis)
    memory = await read_memory(redis, keys)
    assert sorted(memory) == ["c0", "c1", "c2"]
    await publish(redis, keys, make_update("m3", base=4, value=5.0, client="c1"))
    await drain(settings, redis)  # restored from the state and the memory hash
    assert (await read_memory(redis, keys))["c1"] != memory["c1"]  # c1's delta replaced
    # back to FedAsync: the remembered update since the last step is stepped, memory emptied
    await switch(redis, keys, mode="fedasync")
    await publish(redis, keys, make_update("f0", base=5, value=1.0, client="c0"))
    await drain(settings, redis)

    entries = await ledger(redis, keys)
    outcomes = {e["update_id"]: (e["outcome"], e["reason"], e["server_step"]) for e in entries}
    assert outcomes["old"] == (Outcome.DROPPED.value, "base_unavailable", False)
    # memory steps every K = 2 applied updates: m1 (with m0) and m3 (with m2, and c0's and c1's
    # deltas still remembered); f0 finds nothing pending, empties the memory and mixes
    steps = [e["update_id"] for e in entries if e["server_step"]]
    assert steps == ["a0", "a1", "a2", "m1", "m3", "f0"]
    assert entries[-1]["version"] == 6
    assert await read_memory(redis, keys) == {}
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.state_matches
