"""The alerts stream: one writer function for everyone who raises an alert.

The control service's rules append here, and so do the aggregator and the snapshot service when
they find that Redis moved back in time. Each record is `rule`, `message`, `at` (Unix seconds)
and, for a per-device alert, `client`; `GET /v1/alerts` and `fedasync up` show them.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fedasync.services.runtime.redis_conn import TRANSIENT, as_text
from fedasync.shared.keys import Keys

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


def alert_record(entry_id: bytes | str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One alert as every reader shows it (`GET /v1/alerts`, the run folder's summary): its
    entry `id`, `rule`, `message`, `client` if any, and `at` as a number of Unix seconds."""
    record: dict[str, Any] = {"id": as_text(entry_id)}
    record |= {as_text(k): as_text(v) for k, v in fields.items()}
    with contextlib.suppress(KeyError, ValueError):  # a record written by hand: as it is
        record["at"] = float(record["at"])
    return record


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
