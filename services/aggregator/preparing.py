"""Preparing a read for deciding: each entry's message found, its signature checked, decoded.

None of this needs the aggregation state, so it can run outside the deciding process: the
reader process (services/aggregator/reader_process.py) runs it and hands the results through
shared memory; in one-process mode the decider runs it itself (services/aggregator/deciding.py).
One implementation, so both modes refuse and decode exactly alike.

What a read needs from Redis or the claim-check store (the signers' keys, the messages it names
by address, and for an entry whose signature no longer holds because its device's key was
rotated, ingest's marker: services/stores/ingest_markers.py) is fetched once, before any entry is
prepared, its signatures checked with it. A large read is checked and decoded in a worker thread
(hashing and numpy release the GIL on large buffers), so the event loop meanwhile receives the
next read or sends the commit in flight.

Each entry becomes a `Ready` (its decoded update) or a `Refused` (the dead letter the decider
writes: claim-check message missing, no message, unsigned, forged, undecodable, signed by another
client than the update names). Metrics are counted by the decider, from the flags each carries:
the reader process's counters would never reach /metrics.

This module must stay light: the reader process imports it, and must not import torch
(tests/unit/test_reader_imports.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.reader import Entry
from fedasync.services.runtime.own_run import own_domain
from fedasync.services.runtime.redis_conn import retrying
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.claim_check import ClaimError, ClaimSource
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.ingest_markers import IngestMarkers, vouches
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import (
    AuthError,
    AuthReason,
    Proof,
    check_claim,
    stream_id_ms,
    verify,
)
from fedasync.shared.update import Update
from fedasync.shared.wire import WireError, decode_update

#: payload bytes in one read from which it is prepared (and decided) in a worker thread (numpy
#: and hashing release the GIL on large buffers, so the event loop runs meanwhile); below, inline
THREAD_DECIDE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Ready:
    """An entry whose update the core is to decide."""

    stream_id: bytes
    update: Update
    #: the message: whole in one process; from the reader, its dead-letter prefix (what a core
    #: rejection keeps), or whole when payloads are archived
    raw: bytes
    #: a claim-check entry's content address (its message stays in its store)
    address: str | None
    #: whether a signature was verified for it (the `authenticated` metric)
    authenticated: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """An entry refused before the core sees it: a dead letter, and its metric."""

    stream_id: bytes
    reason: str
    detail: str
    payload: bytes
    #: what the decider logs with the dead letter (None: nothing, as for a missing payload)
    warning: str | None
    authenticated: bool = False


Prepared = Ready | Refused


class Preparer:
    """Finds, checks and decodes the entries of a read, in stream order."""

    def __init__(
        self,
        settings: Settings,
        device_keys: KeyCache,
        markers: IngestMarkers,
        claim_store: ClaimSource | None,
    ) -> None:
        self._settings = settings
        #: the devices' public keys, re-read on a miss and after `auth.key_refresh_s`
        self.device_keys = device_keys
        #: ingest's markers, which vouch for an entry whose device's key was rotated since
        self._markers = markers
        #: where claim-check entries' messages are (None: such entries are refused as missing)
        self._claim_store = claim_store

    async def prepare(
        self, entries: list[Entry], stopping: asyncio.Event | None
    ) -> tuple[list[Prepared], bool]:
        """The read's entries prepared, in order, and whether the read is large (prepared in
        a worker thread; the decider then decides it in one too)."""
        signers = {c for _, fields in entries if (c := _signer(fields)) is not None}
        if signers:  # one round trip for the keys of the whole read, before checking any
            await retrying(
                "HMGET device keys",
                lambda: self.device_keys.load(signers),
                self._settings.redis,
                stopping,
            )
        addresses = {a for _, fields in entries if (a := stream_entry.address_of(fields))}
        claimed = await self._fetch_claims(addresses, stopping) if addresses else {}
        size = sum(len(stream_entry.message_of(fields) or b"") for _, fields in entries)
        size += sum(len(m) for m in claimed.values() if isinstance(m, bytes))
        threaded = size >= THREAD_DECIDE_BYTES
        auth: dict[bytes, Proof | AuthError | None] = {}
        if signers:  # checked ahead, so that what a refusal needs from Redis is fetched once
            if threaded:
                auth = await asyncio.to_thread(self._authenticate_all, entries, claimed)
            else:
                auth = self._authenticate_all(entries, claimed)
            await self._vouch_rotated(entries, claimed, auth, stopping)
        if threaded:
            prepared = await asyncio.to_thread(self._prepare_all, entries, claimed, auth)
        else:  # small: a thread's hand-over would cost more than the overlap gains
            prepared = self._prepare_all(entries, claimed, auth)
        return prepared, threaded

    def _prepare_all(
        self,
        entries: list[Entry],
        claimed: dict[str, bytes | ClaimError],
        auth: dict[bytes, Proof | AuthError | None],
    ) -> list[Prepared]:
        return [self._prepare(i, f, claimed, auth) for i, f in entries]

    def _prepare(
        self,
        stream_id: bytes,
        fields: dict[bytes, bytes] | None,
        claimed: dict[str, bytes | ClaimError],
        auth: dict[bytes, Proof | AuthError | None],
    ) -> Prepared:
        raw = stream_entry.message_of(fields)
        address = stream_entry.address_of(fields) if raw is None else None
        if address is not None:
            found = claimed.get(address)
            if not isinstance(found, bytes):  # missing, or not the bytes it names
                error = found or ClaimError("claim_missing", f"{address} was not fetched")
                detail = f"{address}: {error.detail}"
                return Refused(stream_id, error.reason, detail, address.encode(), str(error))
            raw = found
        if raw is None:  # trimmed while pending, or written by something else
            return Refused(stream_id, "missing_payload", "entry has no message", b"", None)
        checked = auth.get(stream_id, _UNCHECKED)
        authenticated = isinstance(checked, Proof)
        try:
            if checked is _UNCHECKED:
                proof = self._authenticate(stream_id, fields or {}, raw)
                authenticated = proof is not None
            elif isinstance(checked, AuthError):
                raise checked
            else:
                proof = checked  # type: ignore[assignment]
            update = decode_update(raw, self._settings.wire.max_message_bytes)
            if proof is not None:
                check_claim(proof, update.client_id)
        except (AuthError, WireError) as exc:
            # refused before the core sees it: no dedup entry, so a forgery under a real
            # update id cannot block the genuine update
            keep = raw[: self._settings.aggregator.deadletter_payload_bytes]
            return Refused(stream_id, exc.reason.value, exc.detail, keep, str(exc), authenticated)
        return Ready(stream_id, update, raw, address, authenticated)

    def _authenticate_all(
        self, entries: list[Entry], claimed: dict[str, bytes | ClaimError]
    ) -> dict[bytes, Proof | AuthError | None]:
        """Each entry's signer checked (`_authenticate`), or why not; entries without their
        message are left out (`_prepare` refuses them for that)."""
        out: dict[bytes, Proof | AuthError | None] = {}
        for stream_id, fields in entries:
            raw = _message(fields, claimed)
            if raw is None:
                continue
            try:
                out[stream_id] = self._authenticate(stream_id, fields or {}, raw)
            except AuthError as exc:
                out[stream_id] = exc
        return out

    async def _vouch_rotated(
        self,
        entries: list[Entry],
        claimed: dict[str, bytes | ClaimError],
        auth: dict[bytes, Proof | AuthError | None],
        stopping: asyncio.Event | None,
    ) -> None:
        """Take the `bad_signature` entries that ingest verified when it added them: the
        device's key was rotated since (services/stores/ingest_markers.py). One MGET, only for
        a read that holds such entries."""
        suspects: list[tuple[bytes, bytes, Proof, tuple[str, str]]] = []
        for stream_id, fields in entries:
            refused = auth.get(stream_id)
            if not isinstance(refused, AuthError) or refused.reason is not AuthReason.BAD_SIGNATURE:
                continue
            raw = _message(fields, claimed)
            if raw is None:
                continue
            try:
                proof = stream_entry.proof_of(fields)
                update = decode_update(raw, self._settings.wire.max_message_bytes)
            except (AuthError, WireError):
                continue  # refused all the same when prepared
            suspects.append((stream_id, raw, proof, (proof.client_id, update.update_id)))
        if not suspects:
            return
        found = await retrying(
            "MGET ingest markers",
            lambda: self._markers.get([s[3] for s in suspects]),
            self._settings.redis,
            stopping,
        )
        for (stream_id, raw, proof, (client_id, update_id)), marker in zip(
            suspects, found, strict=True
        ):
            if vouches(marker, stream_id, raw):
                auth[stream_id] = proof
                log.info(
                    "taking %s (%s of %s): its key was rotated after ingest verified it",
                    stream_id.decode(),
                    update_id,
                    client_id,
                )

    async def _fetch_claims(
        self, addresses: set[str], stopping: asyncio.Event | None
    ) -> dict[str, bytes | ClaimError]:
        """The claim-check messages of a read, fetched and checked (the directory store in a
        worker thread, Redis in one round trip per node, retried while Redis is away) before
        any of it is prepared; without a store each is missing (a rejection, not a crash)."""
        store = self._claim_store
        if store is None:
            missing = ClaimError("claim_missing", "no claim-check store configured")
            return dict.fromkeys(addresses, missing)
        return await retrying(
            "fetch claim-check objects",
            lambda: store.fetch(addresses),
            self._settings.redis,
            stopping,
        )

    def _authenticate(
        self, stream_id: bytes, fields: dict[bytes, bytes], raw: bytes
    ) -> Proof | None:
        """The verified signer of an entry; None if unsigned and signatures are not required.

        The time of receipt is the entry id's millisecond part (set by Redis at XADD), not this
        process's clock, so an entry re-read after an outage is judged as when it arrived.
        """
        try:
            proof = stream_entry.proof_of(fields)
        except AuthError as exc:
            if exc.reason is AuthReason.UNSIGNED and not self._settings.auth.required:
                return None
            raise
        key = self.device_keys.key_of(proof.client_id)
        window_ms = self._settings.auth.window_ms
        # under the run's own domain: a body signed for another run never verifies here
        verify(proof, key, raw, stream_id_ms(stream_id), window_ms, own_domain(self._settings))
        return proof


#: `_prepare`'s marker for an entry whose signature was not checked ahead of the read
_UNCHECKED = object()


def _message(
    fields: dict[bytes, bytes] | None, claimed: dict[str, bytes | ClaimError]
) -> bytes | None:
    """An entry's message: in the entry, or fetched from the claim-check store."""
    raw = stream_entry.message_of(fields)
    if raw is not None:
        return raw
    address = stream_entry.address_of(fields)
    found = claimed.get(address) if address is not None else None
    return found if isinstance(found, bytes) else None


def _signer(fields: dict[bytes, bytes] | None) -> str | None:
    """The client id an entry claims to be signed by, if readable (checked later, not here)."""
    client = (fields or {}).get(b"c")
    if client is None:
        return None
    try:
        return client.decode("utf-8")
    except UnicodeDecodeError:
        return None
