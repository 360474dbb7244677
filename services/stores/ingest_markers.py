"""The ingest service's markers, read by the aggregator: proof that ingest verified an entry.

Ingest's script (services/ingest/ingest.lua) sets `{p}:ingested:<digest of client and update
id>` to `<entry id> <SHA-256 hex of the body>` in the same atomic step as the XADD of an update
whose signature it checked, and only while the device's stored key is still the one it checked
with (services/ingest/store.py). No other user may write these keys (services/stores/acl.py: a
device on a trusted network may XADD, never SET them), so a marker that names an entry and its
exact body says: this entry was authenticated with the key in force when Redis received it.

The aggregator checks every entry again with the device's key of *now*. When a device's key was
rotated (`fedasync devices add` again) after ingest accepted some of its updates and before the
aggregator decided them, that check fails; without the marker those updates would be refused
although the device was told they were in, and its retry (same update id, same body) would be
answered from the marker and never added again: acknowledged, yet never decided. So a
`bad_signature` entry is taken when its marker vouches for it, and only then (a revoked key's
updates stay refused as `revoked`). The marker outlives any sensible outage (FEDASYNC_INGEST__
IDEMPOTENCY_TTL_S, a day); once it has expired, a retry is added anew and judged with the new key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from fedasync.shared.keys import Keys, update_digest


def vouches(marker: bytes | None, entry_id: bytes, body: bytes) -> bool:
    """Whether an ingest marker names exactly this entry and this body."""
    if marker is None:
        return False
    named, _, digest = marker.partition(b" ")
    return named == entry_id and digest == hashlib.sha256(body).hexdigest().encode()


class IngestMarkers:
    """The markers of a read's refused entries, looked up in one round trip."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def get(self, updates: Sequence[tuple[str, str]]) -> list[bytes | None]:
        """The markers of these (client id, update id) pairs, in order (None: absent)."""
        names = [self._keys.ingested(update_digest(c, u)) for c, u in updates]
        found: Any = await self._redis.mget(names)
        return list(found)
