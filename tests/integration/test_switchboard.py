"""A switch flip is one script: the policy version, its log entry and the switch's record change
together or not at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.control.switchboard import set_switch
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.policy_store import (
    PolicyConflict,
    SwitchChange,
    change_policy,
    ensure_policy,
    policy_log,
    read_policy,
)
from fedasync.shared.keys import Keys
from fedasync.shared.switches import switch_off

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def snapshot(redis: aioredis.Redis, keys: Keys) -> tuple[Any, ...]:
    """Everything a flip writes."""
    return (
        await redis.get(keys.policy),
        await redis.hgetall(keys.policies),
        await redis.llen(keys.policy_log),
        await redis.hgetall(keys.switches),
    )


async def test_a_flip_from_a_stale_version_touches_nothing(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await ensure_policy(redis, keys, settings.policy.to_policy())
    await set_switch(redis, keys, "raise-gamma", True, reason="spike", who="rule:update-rate")
    # a flip off reads the record and the policy (version 1) …
    record: Any = await redis.hget(keys.switches, "raise-gamma")
    read = await read_policy(redis, keys)
    # … an operator changes the policy meanwhile (version 2) …
    patched = read.evolve(alpha0=0.5)
    await change_policy(redis, keys, patched, who="ops", why="patch", at=1.0)
    before = await snapshot(redis, keys)
    # … and the flip, now stale, is refused as a whole: the switch stays on with its record
    stale = switch_off(read, json.loads(record)["saved"])
    change = SwitchChange("raise-gamma", before=record, after=None)
    with pytest.raises(PolicyConflict, match="no longer the one in force"):
        await change_policy(redis, keys, stale, who="rule", why="calm", at=2.0, switch=change)
    assert await snapshot(redis, keys) == before
    assert await redis.hget(keys.switches, "raise-gamma") == record


async def test_a_flip_whose_switch_changed_since_it_was_read_touches_nothing(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    policy = await ensure_policy(redis, keys, settings.policy.to_policy())
    # read as off; by the time the script runs, a record is there (same policy version)
    await redis.hset(keys.switches, "raise-gamma", json.dumps({"who": "elsewhere"}))
    before = await snapshot(redis, keys)
    new = policy.evolve(gamma=0.9)
    change = SwitchChange("raise-gamma", before=None, after=json.dumps({"who": "me"}))
    with pytest.raises(PolicyConflict, match="switch raise-gamma changed"):
        await change_policy(redis, keys, new, who="me", why="on", at=1.0, switch=change)
    assert await snapshot(redis, keys) == before


async def test_a_flip_writes_the_policy_its_log_and_the_record_together(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await ensure_policy(redis, keys, settings.policy.to_policy())
    on = await set_switch(redis, keys, "raise-gamma", True, reason="spike", who="ops")
    record = json.loads(await redis.hget(keys.switches, "raise-gamma"))
    assert (record["who"], record["reason"], record["saved"]) == ("ops", "spike", {"gamma": 0.6})
    [entry] = await policy_log(redis, keys)
    assert (entry["version"], entry["who"], entry["policy"]) == (on.version, "ops", on.to_dict())
    assert entry["at"] == record["at"]  # one flip, one instant
    off = await set_switch(redis, keys, "raise-gamma", False, reason="calm", who="ops")
    assert (off.gamma, off.version) == (0.6, 2)
    assert await redis.hgetall(keys.switches) == {}
    assert await redis.llen(keys.policy_log) == 2
