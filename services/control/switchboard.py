"""Flip a degrade switch in Redis: one path for operators (HTTP) and the automatic rules."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from services.keys import Keys
from services.policy_store import change_policy, read_policy
from shared.policy import Policy
from shared.switches import SWITCHES, SwitchError, switch_off, switch_on


class AlreadyInState(SwitchError):
    """The switch is already on (or off)."""


async def set_switch(
    redis: aioredis.Redis, keys: Keys, name: str, on: bool, *, reason: str, who: str
) -> Policy:
    """Turn `name` on or off as a new, audited policy version; the new policy.

    Raises SwitchError for an unknown switch, AlreadyInState, or PolicyConflict if the policy
    changed in between (read again and retry).
    """
    if name not in SWITCHES:
        raise SwitchError(f"unknown switch {name!r}; known: {sorted(SWITCHES)}")
    record: Any = await redis.hget(keys.switches, name)
    if (record is not None) == on:
        raise AlreadyInState(f"switch {name} is already {'on' if on else 'off'}")
    current = await read_policy(redis, keys)
    if on:
        new, saved = switch_on(current, name)
    else:
        new = switch_off(current, json.loads(record)["saved"])
    why = f"switch {name} {'on' if on else 'off'}: {reason}"
    await change_policy(redis, keys, new, who=who, why=why, at=time.time())
    if on:
        entry = {"reason": reason, "who": who, "at": time.time(), "saved": saved}
        await redis.hset(keys.switches, name, json.dumps(entry))
    else:
        await redis.hdel(keys.switches, name)
    return new
