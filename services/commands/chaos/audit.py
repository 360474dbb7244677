"""After the run: read the ledger and the stream, and replay the ledger (`ledger verify`).

Uses the same code as `fedasync ledger export` and `fedasync ledger verify`, so the harness
checks exactly what an operator would run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import as_text, connect, stream_entries
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.ledger import VerifyReport, records, verify
from fedasync.shared.keys import Keys
from fedasync.shared.wire import DEFAULT_MAX_MESSAGE_BYTES


@dataclass(slots=True)
class Audit:
    records: list[dict[str, Any]]
    entry_ids: list[str]
    dead_lettered: set[str]
    verify: VerifyReport
    #: alerts recorded during the run, by rule (a state mismatch or a version regression is a
    #: finding: Redis moved back in time, or a check raised a false alarm)
    alerts: Counter[str] = field(default_factory=Counter)
    #: commands Redis refused a user (ACL LOG): under the ACL, each is a right a service lacks
    refused: list[str] = field(default_factory=list)


async def audit(url: str, keys: Keys, cluster: str | None = None) -> Audit:
    """`cluster`: the seed nodes of a Redis Cluster (`url` then gives only user and password;
    ACL LOG is the one node's the client asks)."""
    client = connect(RedisSettings(url=url, cluster=cluster, socket_timeout_s=30.0))
    try:
        ledger = [record async for record in records(client, keys)]
        entries = await entry_ids(client, keys.updates)
        dead: Any = await client.xrange(keys.deadletter)
        dead_lettered = {fields[b"stream_id"].decode() for _, fields in dead}
        report = await verify(client, keys, DEFAULT_MAX_MESSAGE_BYTES)
        raised: Any = await client.xrange(keys.alerts)
        alerts = Counter(fields[b"rule"].decode() for _, fields in raised)
        return Audit(ledger, entries, dead_lettered, report, alerts, await refusals(client))
    finally:
        await client.aclose()


async def refusals(client: aioredis.Redis) -> list[str]:
    """Commands Redis's ACL refused a user since it started (ACL LOG), one line each.

    Failed logins are left out: the readiness probe tries the `health` user on any Redis.
    """
    log: Any = await client.acl_log()
    return [
        f"{as_text(e['username'])}: {as_text(e['object'])} ({as_text(e['reason'])})"
        for e in log
        if as_text(e["reason"]) != "auth"
    ]


async def entry_ids(client: aioredis.Redis, stream: str) -> list[str]:
    """Every entry id of `stream`, oldest first."""
    return [entry_id async for entry_id, _ in stream_entries(client, stream)]
