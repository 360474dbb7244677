"""The policy in force, kept in Redis as a versioned record.

The current policy is one JSON value; every version ever in force is also kept by number, so a
ledger replay can use the exact policy each decision names. Changes go through `change_policy`,
a compare-and-set on the version, with who, when and why appended to the policy log, in one
script (policy_change.lua, beside this file; its outcomes are `PolicyChange`).

The history is append-only by construction, not by convention: versions are added with HSETNX
(never overwritten) and the log is a list appended with RPUSH (no command that may append to it
can also remove from it, unlike XADD, whose MAXLEN option trims a stream). So the control
service's Redis user, which holds only those two commands on these keys, and LRANGE to read the
log back (services/stores/acl.py), cannot delete or rewrite the history even with its password in
the wrong hands.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from fedasync.services.runtime import lua
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy


class PolicyChange(StrEnum):
    """How the policy change script ended: the value it returns, from the prelude made of this
    enum (services/runtime/lua.py), so both sides read these names and nothing else."""

    #: the new policy is in force, in the history and in the log (and the switch's record set)
    CHANGED = "changed"
    #: the policy in force is not the version read (`PolicyConflict`)
    VERSION_MOVED = "version-moved"
    #: the switch's record changed since it was read (`PolicyConflict`)
    SWITCH_MOVED = "switch-moved"
    #: the new version is already in the history, which is never overwritten (`PolicyConflict`)
    VERSION_RECORDED = "version-recorded"


#: the compare-and-set of a change: policy_change.lua, beside this file; made once
CHANGE_SCRIPT = lua.load(__package__, "policy_change.lua", PolicyChange)


@dataclass(frozen=True, slots=True)
class SwitchChange:
    """A degrade switch's record in the switches hash, changed together with the policy.

    `before` is the record as read (None: the switch was off), `after` the new one (None: delete
    it, the switch goes off). Records are JSON objects, never empty.
    """

    name: str
    before: bytes | str | None
    after: str | None


class NoPolicy(LookupError):
    """No policy is in Redis yet: the aggregator installs the first one when it first starts."""


class PolicyConflict(RuntimeError):
    """The policy changed since it was read; read it again and retry."""


class OldPolicyLog(RuntimeError):
    """The policy log is still the stream an earlier fedasync wrote (before it became a list).

    Every policy change would fail on it (WRONGTYPE), so nothing runs until `fedasync migrate`
    has converted it; the services' own Redis users may not rewrite the history, the admin may.
    """


async def check_policy_log(redis: aioredis.Redis, keys: Keys) -> None:
    """Refuse to start on a policy log in the earlier format (see `OldPolicyLog`)."""
    kind: Any = await redis.type(keys.policy_log)
    if (kind.decode() if isinstance(kind, bytes) else kind) == "stream":
        raise OldPolicyLog(
            f"{keys.policy_log} is a stream written by an earlier fedasync: run "
            "`fedasync migrate` once as the admin Redis user (docs/operations.md, Upgrading), "
            "then start again"
        )


def log_entry(version: int, policy: Policy, who: str, why: str, at: float) -> str:
    """One record of the policy log, as `change_policy` appends it and `policy_log` reads it."""
    entry = {"version": version, "policy": policy.to_dict(), "who": who, "why": why, "at": at}
    return json.dumps(entry, sort_keys=True)


async def migrate_policy_log(redis: aioredis.Redis, keys: Keys) -> int | None:
    """Convert a policy log kept as a stream (fields version, policy, who, why, at) into the
    list `policy_log` reads, same records in the same order; None if there was nothing to do.

    WATCH makes it all or nothing: a change appended meanwhile (by a control service of the old
    release still running) aborts the conversion, which then starts again from the new stream.
    """
    while True:
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(keys.policy_log)
                kind: Any = await pipe.type(keys.policy_log)
                if (kind.decode() if isinstance(kind, bytes) else kind) != "stream":
                    return None
                rows: Any = await pipe.xrange(keys.policy_log)
                records = [_old_log_entry(fields) for _, fields in rows]
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.delete(keys.policy_log)
                if records:
                    pipe.rpush(keys.policy_log, *records)
                await pipe.execute()
                return len(records)
            except WatchError:
                continue


def _old_log_entry(fields: dict[bytes, bytes]) -> str:
    text = {k.decode(): v.decode() for k, v in fields.items()}
    return log_entry(
        int(text["version"]),
        _decode(text["policy"]),
        text["who"],
        text["why"],
        float(text["at"]),
    )


def _encode(policy: Policy) -> str:
    return json.dumps(policy.to_dict(), sort_keys=True)


def _decode(raw: bytes | str) -> Policy:
    data: dict[str, Any] = json.loads(raw)
    return Policy.from_dict(data)


async def ensure_policy(redis: aioredis.Redis, keys: Keys, initial: Policy) -> Policy:
    """The policy in force, installing `initial` if there is none yet.

    The history record goes first, so a version is never in force without it: should this be
    cut short (a reply lost after the SET ran) and repeated, HSETNX and SET NX both find their
    value in place and change nothing. The other order left the history without version 0 for
    good, and `ledger verify` without the policy of the first decisions.
    """
    await redis.hsetnx(keys.policies, str(initial.version), _encode(initial))
    await redis.set(keys.policy, _encode(initial), nx=True)
    return await read_policy(redis, keys)


async def read_policy(redis: aioredis.Redis, keys: Keys) -> Policy:
    raw = await redis.get(keys.policy)
    if raw is None:
        raise NoPolicy(f"no policy at {keys.policy}: the aggregator has not started yet")
    return _decode(raw)


async def policy_version(redis: aioredis.Redis, keys: Keys, version: int) -> Policy:
    """A policy that was in force at some time, by its version (for ledger replay)."""
    raw = await redis.hget(keys.policies, str(version))
    if raw is None:
        raise LookupError(f"policy version {version} is not recorded")
    return _decode(raw)


async def every_policy(redis: aioredis.Redis, keys: Keys) -> list[Policy]:
    """Every policy version ever in force, oldest first (a replay asks whether any used DP)."""
    raw: Any = await redis.hgetall(keys.policies)
    return sorted(_decode(value) for value in raw.values())


async def change_policy(
    redis: aioredis.Redis,
    keys: Keys,
    new: Policy,
    *,
    who: str,
    why: str,
    at: float,
    switch: SwitchChange | None = None,
) -> None:
    """Install `new`, whose version must be one more than the policy in force, and with it
    `switch`'s record, atomically: nothing is written unless both are as they were read."""
    names = [keys.policy, keys.policies, keys.policy_log]
    args = lua.ScriptArgs(in_force=new.version - 1, version=str(new.version))
    args.value("policy", _encode(new))
    args.value("entry", log_entry(new.version, new, who, why, at))
    if switch is not None:
        names.append(keys.switches)
        args.field("switch", switch.name)
        args.value("before", switch.before or "")
        args.value("after", switch.after or "")
    done = lua.outcome(PolicyChange, await CHANGE_SCRIPT(redis, keys=names, args=args.argv()))
    if done is PolicyChange.VERSION_MOVED:
        raise PolicyConflict(f"policy version {new.version - 1} is no longer the one in force")
    if done is PolicyChange.SWITCH_MOVED:
        assert switch is not None
        raise PolicyConflict(f"switch {switch.name} changed since it was read")
    if done is PolicyChange.VERSION_RECORDED:
        raise PolicyConflict(
            f"policy version {new.version} is already in the history but not in force: "
            "the records disagree; nothing was changed"
        )


async def policy_log(
    redis: aioredis.Redis, keys: Keys, last: int | None = None
) -> list[dict[str, Any]]:
    """Policy changes, oldest first: every one, or only the `last` (at least 1) most recent.
    Each is version, policy (an object), who, why, at (Unix seconds), as `log_entry` wrote it.

    The one reader of the log (`GET /v1/policy/history`, bench/load.py): one LRANGE, the only
    read the control user may make of it (services/stores/acl.py).
    """
    if last is not None and last < 1:
        raise ValueError(f"last must be at least 1, not {last}")
    raw: Any = await redis.lrange(keys.policy_log, 0 if last is None else -last, -1)
    return [json.loads(item) for item in raw]


class PolicyCache:
    """The policy in force, re-read at most every `refresh_s` (0: on every call).

    For a service that consults the policy per request (ingest): Redis sees one GET per interval,
    and a change takes effect within the interval.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, refresh_s: float) -> None:
        self._redis = redis
        self._keys = keys
        self._refresh_s = refresh_s
        self._policy: Policy | None = None
        self._read_at = float("-inf")

    async def get(self, now: float) -> Policy:
        if self._policy is None or now - self._read_at >= self._refresh_s:
            self._policy = await read_policy(self._redis, self._keys)
            self._read_at = now
        return self._policy
