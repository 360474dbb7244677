"""Receipts: which decision one device's update got, looked up by (client id, update id).

The index is written by the aggregator's commit script, in the same atomic step as the ledger
entry it names (services/aggregator/commit.py): `{p}:receipts` maps
`update_digest(client id, update id)` to the ledger entry id of the first decision about that
update, and holds at most FEDASYNC_RECEIPTS__CAPACITY of them, the oldest forgotten first. The
record itself stays in the ledger (never trimmed), so the index costs one short field per update.

A lookup is keyed by the client id too, so a device asking about another device's update id finds
nothing, exactly as for an id nobody used: the answer cannot tell the two apart.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import as_text
from fedasync.services.stores.keys import Keys, update_digest
from fedasync.services.stores.ledger import record_at


async def lookup(
    redis: aioredis.Redis, keys: Keys, client_id: str, update_id: str
) -> dict[str, Any] | None:
    """The ledger record of the decision about `update_id` of `client_id` (with `ledger_id`), or
    None: not decided yet, never seen, another device's, or older than the index keeps."""
    named: Any = await redis.hget(keys.receipts, update_digest(client_id, update_id))
    if named is None:
        return None
    record = await record_at(redis, keys, as_text(named))
    if record is None or (record["client_id"], record["update_id"]) != (client_id, update_id):
        return None  # cannot happen short of a SHA-256 collision; never show another's record
    return record
