"""The policy in force, kept in Redis as a versioned record.

The current policy is one JSON value; every version ever in force is also kept by number, so a
ledger replay can use the exact policy each decision names. Changes go through `change_policy`,
a compare-and-set on the version, with who, when and why appended to a log stream.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from services.keys import Keys
from shared.policy import Policy

_CHANGE_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current and cjson.decode(current)['version'] ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[2])
redis.call('XADD', KEYS[3], '*', 'version', ARGV[3], 'policy', ARGV[2],
           'who', ARGV[4], 'why', ARGV[5], 'at', ARGV[6])
return 1
"""


class PolicyConflict(RuntimeError):
    """The policy changed since it was read; read it again and retry."""


def _encode(policy: Policy) -> str:
    return json.dumps(policy.to_dict(), sort_keys=True)


def _decode(raw: bytes | str) -> Policy:
    data: dict[str, Any] = json.loads(raw)
    return Policy.from_dict(data)


async def ensure_policy(redis: aioredis.Redis, keys: Keys, initial: Policy) -> Policy:
    """The policy in force, installing `initial` if there is none yet."""
    if await redis.set(keys.policy, _encode(initial), nx=True):
        await redis.hsetnx(keys.policies, str(initial.version), _encode(initial))
    return await read_policy(redis, keys)


async def read_policy(redis: aioredis.Redis, keys: Keys) -> Policy:
    raw = await redis.get(keys.policy)
    if raw is None:
        raise LookupError(f"no policy at {keys.policy}")
    return _decode(raw)


async def policy_version(redis: aioredis.Redis, keys: Keys, version: int) -> Policy:
    """A policy that was in force at some time, by its version (for ledger replay)."""
    raw = await redis.hget(keys.policies, str(version))
    if raw is None:
        raise LookupError(f"policy version {version} is not recorded")
    return _decode(raw)


async def change_policy(
    redis: aioredis.Redis, keys: Keys, new: Policy, *, who: str, why: str, at: float
) -> None:
    """Install `new`, whose version must be one more than the policy in force."""
    script = redis.register_script(_CHANGE_SCRIPT)
    ok = await script(
        keys=[keys.policy, keys.policies, keys.policy_log],
        args=[new.version - 1, _encode(new), str(new.version), who, why, repr(at)],
    )
    if not ok:
        raise PolicyConflict(f"policy version {new.version - 1} is no longer the one in force")


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
