"""The alerts stream: one writer function for everyone who raises an alert.

The control service's rules append here, and so do the aggregator and the snapshot service when
they find that Redis moved back in time. Each record is `rule`, `message`, `at` (Unix seconds)
and, for a per-device alert, `client`; `GET /v1/alerts` and `fedasync up` show them.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.stores.keys import Keys

log = logging.getLogger(__name__)

#: records kept, about (XADD MAXLEN ~)
KEEP = 10_000

#: the aggregator found a state that does not match its ledger or consumer group
STATE_MISMATCH = "aggregator-state-mismatch"
#: Redis refused a write for want of memory (maxmemory): the writer retries until it is freed
REDIS_OOM = "redis-out-of-memory"
#: the snapshot service saw Redis report a version lower than one it had served
VERSION_REGRESSED = "snapshot-version-regressed"


async def add_alert(
    redis: aioredis.Redis,
    keys: Keys,
    rule: str,
    message: str,
    at: float,
    client: str | None = None,
) -> str:
    """Append one alert; returns its entry id."""
    fields: dict[Any, Any] = {"rule": rule, "message": message, "at": repr(at)}
    if client:
        fields["client"] = client
    entry: Any = await redis.xadd(keys.alerts, fields, maxlen=KEEP, approximate=True)
    return entry.decode() if isinstance(entry, bytes) else str(entry)


async def try_add_alert(
    redis: aioredis.Redis, keys: Keys, rule: str, message: str, at: float
) -> str | None:
    """Best effort, for a service that is already refusing to go on: the log line and the metric
    it raised stand even when Redis cannot take the record (unreachable, or an ACL without it)."""
    try:
        return await add_alert(redis, keys, rule, message, at)
    except (*TRANSIENT, RedisError) as exc:
        log.error("could not record alert %s in %s: %s", rule, keys.alerts, exc)
        return None
