"""The idempotent XADD: one stream entry per (client, update id), however often it is retried.

One Lua script (ingest.lua, beside this file; named fields, outcomes `IngestOutcome`) looks up
the marker `{p}:ingested:<digest>`; if absent it XADDs the entry and sets the marker (entry id +
body digest, with a TTL) in the same atomic step, so two concurrent retries cannot both add an
entry, and a crash cannot leave an entry without its marker. A retry with the same body gets the
first entry id; the same update id with a *different* body is a conflict, never silently dropped.
Never trims the stream (no MAXLEN).

The signing time is judged in the same step, against the new entry id's milliseconds: Redis's
clock, the one the aggregator judges the entry by (shared/device_auth.py `verify`, with the entry
id as the time of receipt). Ingest's own check against its clock comes first and refuses most
late signatures without a write, but a Redis stall between that check and the XADD, or a clock
of Redis's host ahead of ingest's, would let an update be acknowledged that the aggregator then
refuses as `signature_expired`: acknowledged, yet never decided. Outside the window the script
deletes the entry it just added (no reader can see it in between) and sets no marker, so nothing
is acknowledged and a retry, signed afresh, is judged anew.

The key is judged in the same step too: ingest checked the signature with a key it cached (for
up to FEDASYNC_AUTH__KEY_REFRESH_S), and the script adds the entry only if the key stored for the
device is still that one (by the fingerprint of its stored text). A key rotated or revoked while
the update arrived is `KeyChanged`: nothing added, and a retry is judged with the key of now.
The aggregator takes an entry on its marker though the device's key changed after it was added
(services/stores/ingest_markers.py); this check is what makes the marker mean "checked with the
key in force when Redis received it".

Durable mode (`FEDASYNC_REDIS__DURABLE_REPLICAS`): the script and a WAIT run on one connection
(services/runtime/redis_conn.py, `replicated`), so the device hears 202 only once the replicas
hold its entry; short of them it hears 503 and retries. A retry that finds the marker sets it
again (same value, same expiry): that write makes its WAIT cover the first attempt's XADD.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime import lua
from fedasync.services.runtime.redis_conn import as_text, replicated
from fedasync.services.runtime.settings import Durability
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import Proof
from fedasync.shared.keys import Keys, update_digest


class IngestOutcome(StrEnum):
    """How the ingest script ended: the value it returns, from the prelude made of this enum
    (services/runtime/lua.py), so both sides read these names and nothing else."""

    #: the entry is added and its marker set
    ADDED = "added"
    #: the marker is there with this body's digest: a retry, answered with the first entry id
    ALREADY_ADDED = "already-added"
    #: the marker is there with another body's digest (`UpdateIdReused`)
    UPDATE_ID_REUSED = "update-id-reused"
    #: signed outside the window of the XADD's time: the entry deleted again (`SignedOutsideWindow`)
    SIGNED_OUTSIDE_WINDOW = "signed-outside-window"
    #: the device's stored key is no longer the one its signature was checked with (`KeyChanged`)
    KEY_CHANGED = "key-changed"
    #: the run finished training (its done flag is set): nothing added (`RunDone`)
    RUN_DONE = "run-done"


#: the idempotent XADD: ingest.lua, beside this file
INGEST_SCRIPT = lua.load(__package__, "ingest.lua", IngestOutcome)


@dataclass(frozen=True, slots=True)
class Ingested:
    """Where the update is: its stream entry id; `new` is False for a retry of an earlier one."""

    entry_id: str
    new: bool


class SignedOutsideWindow(Exception):
    """Signed too long before (or after) Redis's time of the XADD: nothing was added."""

    def __init__(self, entry_id: str) -> None:
        self.entry_id = entry_id  # deleted again: its milliseconds are Redis's time of receipt
        super().__init__(f"signature outside the window at {entry_id}")


class UpdateIdReused(Exception):
    """The update id was already accepted from this client with different content."""

    def __init__(self, entry_id: str) -> None:
        self.entry_id = entry_id
        super().__init__(f"update id already used for entry {entry_id} with other content")


class KeyChanged(Exception):
    """The device's key was rotated or revoked since ingest read it: nothing was added."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        super().__init__(f"the key of {client_id!r} changed while its update arrived")


class RunDone(Exception):
    """The run finished training before the update arrived (its done flag): nothing was added,
    since no aggregator will decide it once the run's processes are stopped."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the run finished training ({reason}); no update is taken")


class IngestStore:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        ttl_s: int,
        *,
        window_ms: int,
        durability: Durability | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._window_ms = window_ms
        self._durability = durability or Durability()

    async def add(
        self, client_id: str, update_id: str, body: bytes, proof: Proof, key_fingerprint: str
    ) -> Ingested:
        """XADD the signed entry unless this (client, update id) is already in; atomic.
        SignedOutsideWindow if `proof` was signed outside the window of Redis's time of the XADD
        (nothing added), UpdateIdReused if the update id came before with other content,
        KeyChanged if the key stored for the signer no longer has `key_fingerprint` (the one
        the signature was checked with: services/stores/device_keys.py `fingerprint`), RunDone
        once the run finished training (a retry of an update taken before is answered still)."""
        marker = update_digest(client_id, update_id)
        digest = hashlib.sha256(body).hexdigest()
        fields = stream_entry.build(body, proof)
        args = lua.ScriptArgs(
            digest=digest,
            ttl_s=self._ttl_s,
            signed_at_ms=proof.signed_at_ms,
            window_ms=self._window_ms,
            client=proof.client_id,
            key_sha1=key_fingerprint,
        )
        args.section("entry", part=[part for pair in fields.items() for part in pair])
        keys = [
            self._keys.ingested(marker),
            self._keys.updates,
            self._keys.device_keys,
            self._keys.done,
        ]

        async def add(client: aioredis.Redis) -> Any:
            return await INGEST_SCRIPT(client, keys=keys, args=args.argv())

        reply: Any = await replicated(self._redis, self._durability, add, key=keys[1])
        outcome, entry_id = lua.outcome(IngestOutcome, reply[0]), as_text(reply[1])
        if outcome is IngestOutcome.UPDATE_ID_REUSED:
            raise UpdateIdReused(entry_id)
        if outcome is IngestOutcome.SIGNED_OUTSIDE_WINDOW:
            raise SignedOutsideWindow(entry_id)
        if outcome is IngestOutcome.KEY_CHANGED:
            raise KeyChanged(proof.client_id)
        if outcome is IngestOutcome.RUN_DONE:
            raise RunDone(entry_id)
        return Ingested(entry_id, new=outcome is IngestOutcome.ADDED)
