"""The receipts index in Redis, read the one way both its readers read it.

The aggregator's commit script writes `{p}:receipts` in the same atomic step as the ledger entry
it names: `update_digest(client id, update id)` → the ledger entry id of the first decision about
that update, at most FEDASYNC_RECEIPTS__CAPACITY of them, the oldest forgotten first. The record
itself stays in the ledger (never trimmed), so the index costs one short field per update. Read by
the ingest service for a signed `GET /v1/updates/{update_id}` and by a device on a trusted
network straight from Redis (receipts.py); here, in the client, so the device needs nothing of the
services to read it.

A lookup is keyed by the client id too, so a device asking about another device's update id finds
nothing, exactly as for an id nobody used: the answer cannot tell the two apart.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from fedasync.client.redis_link import as_text
from fedasync.shared import ledger_record
from fedasync.shared.keys import Keys, update_digest


async def record_at(redis: aioredis.Redis, keys: Keys, ledger_id: str) -> dict[str, Any] | None:
    """The ledger record with entry id `ledger_id`; None if there is none (what a receipt names;
    the chaos harness looks up, after a Redis restart, the newest record it saw before)."""
    entries: Any = await redis.xrange(keys.ledger, min=ledger_id, max=ledger_id)
    return ledger_record.decode(as_text(entries[0][0]), entries[0][1]) if entries else None


async def lookup(
    redis: aioredis.Redis, keys: Keys, client_id: str, update_id: str
) -> dict[str, Any] | None:
    """The ledger record of the decision about `update_id` of `client_id` (with `ledger_id`), or
    None: not decided yet, never seen, another device's, or older than the index keeps."""
    named: Any = await redis.hget(keys.receipts, update_digest(client_id, update_id))
    if named is None:
        return None
    record = await record_at(redis, keys, as_text(named))
    if record is None or not ledger_record.is_about(record, client_id, update_id):
        return None  # cannot happen short of a SHA-256 collision; never show another's record
    return record
