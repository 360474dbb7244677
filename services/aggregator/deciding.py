"""Deciding one read: each entry authenticated, decoded and applied through the core.

The decisions go into the batch the commit pipeline writes (services/aggregator/pipeline.py):
the acknowledgement, the ledger record, the payload to archive, or a dead letter for an entry
refused before the core sees it (unsigned, forged, undecodable, a claim-check message missing).
What a read needs from Redis or the claim-check store (the signers' keys, the messages it names
by address, and for an entry whose signature no longer holds because its device's key was
rotated, ingest's marker: services/stores/ingest_markers.py) is fetched once, before any entry is
decided, its signatures checked with it; a large read is decided in a worker
thread (numpy releases the GIL on large arrays) so the event loop receives the next read
meanwhile. The state is closed here when the budget of applied updates or of time is spent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from fedasync.learning.held_out import gradient_source, held_out
from fedasync.learning.task import Task
from fedasync.learning.task_failure import guarded
from fedasync.learning.tasks import task_data
from fedasync.services.aggregator.commit import Batch, DeadLetter, LedgerEntry
from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.reader import Entry
from fedasync.services.runtime.own_run import own_domain
from fedasync.services.runtime.redis_conn import retrying
from fedasync.services.runtime.settings import Problem, Settings, SettingsError, TaskSettings
from fedasync.services.stores.archive import ADDRESS_MARK
from fedasync.services.stores.claim_check import ClaimError, ClaimSource
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.ingest_markers import IngestMarkers, vouches
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Outcome
from fedasync.shared.device_auth import (
    AuthError,
    AuthReason,
    Proof,
    check_claim,
    stream_id_ms,
    verify,
)
from fedasync.shared.device_privacy import reported
from fedasync.shared.keys import update_digest
from fedasync.shared.policy import Policy
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.wire import WireError, decode_update, pack

#: payload bytes in one read from which it is decided in a worker thread (numpy releases the
#: GIL on large arrays, so the event loop receives the next read meanwhile); below, inline
THREAD_DECIDE_BYTES = 4 * 1024 * 1024


class Decider:
    """Decides the entries of each read into a batch, from the one state the aggregator holds."""

    def __init__(
        self,
        settings: Settings,
        metrics: AggregatorMetrics,
        device_keys: KeyCache,
        markers: IngestMarkers,
        claim_store: ClaimSource | None,
        archiving: bool,
    ) -> None:
        self._settings = settings
        #: the state decided from (restored, or created, at each start)
        self.state: AggregationState
        self._metrics = metrics
        #: the devices' public keys, re-read on a miss and after `auth.key_refresh_s`
        self.device_keys = device_keys
        #: ingest's markers, which vouch for an entry whose device's key was rotated since
        self._markers = markers
        #: each signed entry of the read being decided: its checked signer, or why refused
        self._auth: dict[bytes, Proof | AuthError | None] = {}
        #: where claim-check entries' messages are (None: such entries are refused as missing)
        self._claim_store = claim_store
        #: whether payloads are archived before their commit (the batch carries them)
        self._archiving = archiving
        #: the messages of the read being decided, fetched by content address ahead of it
        self._claimed: dict[str, bytes | ClaimError] = {}
        #: Zeno++'s validation gradient at given weights, built at its first use
        self._gradient_at: Callable[[np.ndarray], np.ndarray] | None = None

    def gradient_at(self, weights: np.ndarray) -> np.ndarray:
        """Zeno++'s v at `weights`: the task's loss gradient on the held-out set the simulator
        would keep with the same task settings and seed (learning/held_out.py)."""
        if self._gradient_at is None:
            self._gradient_at = zeno_gradient_source(self._settings.task)
        return self._gradient_at(weights)

    async def decide_read(
        self,
        entries: list[Entry],
        batch: Batch,
        policy: Policy,
        stopping: asyncio.Event | None,
    ) -> None:
        """Fetch what the read needs (its signers' keys, its claim-check messages), then decide
        it, in a worker thread when it is large."""
        signers = {c for _, fields in entries if (c := _signer(fields)) is not None}
        if signers:  # one round trip for the keys of the whole read, before deciding any
            await retrying(
                "HMGET device keys",
                lambda: self.device_keys.load(signers),
                self._settings.redis,
                stopping,
            )
        addresses = {a for _, fields in entries if (a := stream_entry.address_of(fields))}
        self._claimed = await self._fetch_claims(addresses, stopping) if addresses else {}
        size = sum(len(stream_entry.message_of(fields) or b"") for _, fields in entries)
        size += sum(len(m) for m in self._claimed.values() if isinstance(m, bytes))
        threaded = size >= THREAD_DECIDE_BYTES
        self._auth = {}
        if signers:  # checked ahead, so that what a refusal needs from Redis is fetched once
            if threaded:
                self._auth = await asyncio.to_thread(self._authenticate_all, entries)
            else:
                self._auth = self._authenticate_all(entries)
            await self._vouch_rotated(entries, stopping)
        if threaded:
            await asyncio.to_thread(self.decide_all, entries, batch, policy)
        else:  # small: a thread's hand-over would cost more than the overlap gains
            self.decide_all(entries, batch, policy)

    def _authenticate_all(self, entries: list[Entry]) -> dict[bytes, Proof | AuthError | None]:
        """Each entry's signer checked (`_authenticate`), or why not; entries without their
        message are left out (`_decide` refuses them for that)."""
        out: dict[bytes, Proof | AuthError | None] = {}
        for stream_id, fields in entries:
            raw = self._message(fields)
            if raw is None:
                continue
            try:
                out[stream_id] = self._authenticate(stream_id, fields or {}, raw)
            except AuthError as exc:
                out[stream_id] = exc
        return out

    async def _vouch_rotated(self, entries: list[Entry], stopping: asyncio.Event | None) -> None:
        """Take the `bad_signature` entries that ingest verified when it added them: the
        device's key was rotated since (services/stores/ingest_markers.py). One MGET, only for
        a read that holds such entries."""
        suspects: list[tuple[bytes, bytes, Proof, tuple[str, str]]] = []
        for stream_id, fields in entries:
            refused = self._auth.get(stream_id)
            if not isinstance(refused, AuthError) or refused.reason is not AuthReason.BAD_SIGNATURE:
                continue
            raw = self._message(fields)
            if raw is None:
                continue
            try:
                proof = stream_entry.proof_of(fields)
                update = decode_update(raw, self._settings.wire.max_message_bytes)
            except (AuthError, WireError):
                continue  # refused all the same when decided
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
                self._auth[stream_id] = proof
                self._metrics.authenticated.inc()
                log.info(
                    "taking %s (%s of %s): its key was rotated after ingest verified it",
                    stream_id.decode(),
                    update_id,
                    client_id,
                )

    def _message(self, fields: dict[bytes, bytes] | None) -> bytes | None:
        """An entry's message: in the entry, or fetched from the claim-check store."""
        raw = stream_entry.message_of(fields)
        if raw is not None:
            return raw
        address = stream_entry.address_of(fields)
        claimed = self._claimed.get(address) if address is not None else None
        return claimed if isinstance(claimed, bytes) else None

    async def _fetch_claims(
        self, addresses: set[str], stopping: asyncio.Event | None
    ) -> dict[str, bytes | ClaimError]:
        """The claim-check messages of a read, fetched and checked (the directory store in a
        worker thread, Redis in one round trip per node, retried while Redis is away) before
        any of it is decided; without a store each is missing (a rejection, not a crash)."""
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

    def decide_all(self, entries: list[Entry], batch: Batch, policy: Policy) -> None:
        for stream_id, fields in entries:
            self._decide(stream_id, fields, batch, policy)

    def _decide(
        self,
        stream_id: bytes,
        fields: dict[bytes, bytes] | None,
        batch: Batch,
        policy: Policy,
    ) -> None:
        started = time.perf_counter()
        batch.acks.append(stream_id)
        raw = stream_entry.message_of(fields)
        address = stream_entry.address_of(fields) if raw is None else None
        if address is not None:
            claimed = self._claimed.get(address)
            if not isinstance(claimed, bytes):  # missing, or not the bytes it names
                error = claimed or ClaimError("claim_missing", f"{address} was not fetched")
                detail = f"{address}: {error.detail}"
                batch.dead.append(DeadLetter(error.reason, detail, stream_id, address.encode()))
                self._metrics.rejections.labels(error.reason).inc()
                log.warning("dead-lettered %s: %s", stream_id.decode(), error)
                return
            raw = claimed
        if raw is None:  # trimmed while pending, or written by something else
            batch.dead.append(DeadLetter("missing_payload", "entry has no message", stream_id, b""))
            self._metrics.rejections.labels("missing_payload").inc()
            return
        cfg = self._settings.aggregator
        try:
            proof = self._checked(stream_id, fields or {}, raw)
            update = decode_update(raw, self._settings.wire.max_message_bytes)
            if proof is not None:
                check_claim(proof, update.client_id)
        except (AuthError, WireError) as exc:
            # refused before the core sees it: no dedup entry, so a forgery under a real
            # update id cannot block the genuine update
            keep = raw[: cfg.deadletter_payload_bytes]
            batch.dead.append(DeadLetter(exc.reason.value, exc.detail, stream_id, keep))
            self._metrics.rejections.labels(exc.reason.value).inc()
            log.warning("dead-lettered %s: %s", stream_id.decode(), exc)
            return
        state = self.state
        state.zeno_prepare(policy, self.gradient_at)  # Zeno++: v afresh when due
        decision = state.apply(update, policy)
        self._metrics.observe(decision, time.perf_counter() - started)
        record = decision.to_dict() | {"stream_id": stream_id.decode(), "at": time.time()}
        # the device's own DP-SGD ε, when it reports one: context beside the decision (the
        # core does not decide it; verify leaves it out), absent otherwise
        record |= reported(update.metrics)
        batch.ledger.append(
            LedgerEntry(pack(record), update_digest(update.client_id, update.update_id))
        )
        if self._archiving:  # a claim-check message stays in its store: its address
            kept = raw if address is None else ADDRESS_MARK + address.encode()
            batch.archive.append((stream_id, kept))
        if decision.outcome is Outcome.REJECTED:  # invalid content: also a dead letter
            keep = raw[: cfg.deadletter_payload_bytes]
            batch.dead.append(DeadLetter(str(decision.reason), decision.detail, stream_id, keep))
        # applied updates, not versions: a FedBuff version takes K of them
        if not state.closed and state.applied >= self._settings.budget.limits(policy)[0]:
            state.close("max_updates")
            log.info("budget reached: %d updates applied", state.applied)

    def _checked(self, stream_id: bytes, fields: dict[bytes, bytes], raw: bytes) -> Proof | None:
        """The signer as checked ahead of the read (`decide_read`), or checked now."""
        if stream_id not in self._auth:
            return self._authenticate(stream_id, fields, raw)
        result = self._auth[stream_id]
        if isinstance(result, AuthError):
            raise result
        return result

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
        self._metrics.authenticated.inc()
        return proof

    def close_if_out_of_time(self, policy: Policy, started_at: float) -> None:
        """Close the state once the run is stopped (`policy.stopped`, an operator's one-way
        end: closed "stopped") or its time budget (from its first start) is spent."""
        if not self.state.closed and policy.stopped:
            self.state.close("stopped")
            log.info("stopped by the policy (version %d)", policy.version)
            return
        elapsed = time.time() - started_at
        limit = self._settings.budget.limits(policy)[1]
        if not self.state.closed and elapsed >= limit:
            self.state.close("max_seconds")
            log.info("budget reached: %.0f s of training", elapsed)


def zeno_gradient_source(task: TaskSettings) -> Callable[[np.ndarray], np.ndarray]:
    """The validation gradient of the task `task` names, on its held-out set: the task's data
    made as every service makes it (`task_data`, the seed's data stream), then `held_out`."""
    raw = task.build()
    if type(raw).gradient is Task.gradient:  # refused in one line, not at the first decision
        message = (
            f"Zeno++ is on, but task {task.name!r} does not compute loss gradients "
            "(Task.gradient): implement it, or turn Zeno++ off (null)"
        )
        raise SettingsError.of((Problem(("policy", "zeno_margin"), None, message),))
    built = guarded(raw, task.name)
    train, _ = task_data(task.name, built, stream(task.seed, Stream.DATA))
    return gradient_source(built, held_out(train, task.validation_samples, task.seed))


def _signer(fields: dict[bytes, bytes] | None) -> str | None:
    """The client id an entry claims to be signed by, if readable (checked later, not here)."""
    client = (fields or {}).get(b"c")
    if client is None:
        return None
    try:
        return client.decode("utf-8")
    except UnicodeDecodeError:
        return None
