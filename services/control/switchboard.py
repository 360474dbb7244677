"""Flip a degrade switch in Redis: one path for operators (HTTP) and the automatic rules."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.stores.policy_store import SwitchChange, change_policy, read_policy
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy
from fedasync.shared.switches import SWITCHES, SwitchError, switch_off, switch_on


class AlreadyInState(SwitchError):
    """The switch is already on (or off)."""


async def set_switch(
    redis: aioredis.Redis, keys: Keys, name: str, on: bool, *, reason: str, who: str
) -> Policy:
    """Turn `name` on or off as a new, audited policy version; the new policy.

    The policy, its log entry and the switch's record (what restores the policy when the switch
    goes off) change in one script, so no crash can separate them.

    Raises SwitchError for an unknown switch, AlreadyInState, or PolicyConflict if the policy or
    the switch changed in between (read again and retry).
    """
    if name not in SWITCHES:
        raise SwitchError(f"unknown switch {name!r}; known: {sorted(SWITCHES)}")
    record: Any = await redis.hget(keys.switches, name)
    if (record is not None) == on:
        raise AlreadyInState(f"switch {name} is already {'on' if on else 'off'}")
    current = await read_policy(redis, keys)
    now = time.time()
    entry: str | None = None
    if on:
        new, saved = switch_on(current, name)
        entry = json.dumps({"reason": reason, "who": who, "at": now, "saved": saved})
    else:
        new = switch_off(current, json.loads(record)["saved"])
    why = f"switch {name} {'on' if on else 'off'}: {reason}"
    change = SwitchChange(name, before=record, after=entry)
    await change_policy(redis, keys, new, who=who, why=why, at=now, switch=change)
    return new


async def switch_owners(redis: aioredis.Redis, keys: Keys) -> dict[str, str]:
    """Switch → who turned it on, for every switch that is on (`?` if its record is unreadable)."""
    records: Any = await redis.hgetall(keys.switches)
    owners = {}
    for name, record in records.items():
        try:
            who = json.loads(record)["who"]
        except (ValueError, TypeError, KeyError):
            who = "?"
        owners[name.decode() if isinstance(name, bytes) else str(name)] = str(who)
    return owners
