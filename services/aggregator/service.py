"""The aggregator: the single consumer of the updates stream, a thin adapter around the core.

Read a few entries, decide each through `AggregationState.apply`, then commit the decisions, the
new model and the acknowledgements together (services/aggregator/commit.py). Nothing is
acknowledged before its decision is durable, and a decision is durable only with the state it
produced, so a kill -9 at any instant loses nothing and applies nothing twice: on restart the
last commit is restored and the entries it did not cover are decided again, from that state.
Entries another consumer holds and does not decide are taken over on a period
(services/aggregator/claims.py). Every Redis call goes through the one retry policy
(services/runtime/redis_conn.py); gauges and trimming are best-effort, so no single transient
error stops the deciding.

Before restoring, the aggregator checks that what Redis holds hangs together (state, version,
ledger, consumer group: services/aggregator/inspection.py); a Redis that lost writes shows up as
a mismatch, and the aggregator refuses to decide anything rather than start over silently. So
does a commit that finds the commit sequence moved under it, or an entry it acknowledges no longer
pending (a failover lost the read that delivered it).

Durable mode (`FEDASYNC_REDIS__DURABLE_REPLICAS`): each read is confirmed on the replicas before
its entries are decided, and each commit before its version is announced (commit.py), so a
failover to a replica loses nothing announced and needs no refusal: the retried commit lands on
the promoted replica and the aggregator carries on (docs/architecture.md, "Past one machine").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.claims import IdleClaims, claim
from fedasync.services.aggregator.commit import (
    Batch,
    CommitConflict,
    Committer,
    DeadLetter,
    LedgerEntry,
)
from fedasync.services.aggregator.http import Readiness, create_app
from fedasync.services.aggregator.inspection import StateMismatch, inspect
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.http_service import listening
from fedasync.services.runtime.lifecycle import cancel_tasks, stop_on_signals
from fedasync.services.runtime.redis_conn import (
    TRANSIENT,
    best_effort,
    connect,
    is_out_of_memory,
    replicated,
    retrying,
    until_sent,
)
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.alerts import REDIS_OOM, STATE_MISMATCH, try_add_alert
from fedasync.services.stores.archive import ADDRESS_MARK, PayloadArchive
from fedasync.services.stores.backlog import correct_lag, read_backlog, trim_decided
from fedasync.services.stores.claim_check import ClaimError, ClaimStore
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys, update_digest
from fedasync.services.stores.policy_store import check_policy_log, ensure_policy, read_policy
from fedasync.services.stores.run_record import check_task, record_run
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState, ModelSnapshot
from fedasync.shared.checkpoint import MemoryMissing, save_state
from fedasync.shared.continuity import Check, Mismatch, mismatches
from fedasync.shared.decision import Outcome
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.device_auth import (
    AuthError,
    AuthReason,
    Proof,
    check_claim,
    stream_id_ms,
    verify,
)
from fedasync.shared.model_format import encode_model
from fedasync.shared.policy import Policy
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.wire import WireError, decode_update, pack

log = logging.getLogger(__name__)

#: how often the policy record is re-read between batches, seconds
POLICY_REFRESH_S = 0.2
#: payload bytes in one read from which it is decided in a worker thread (numpy releases the
#: GIL on large arrays, so the event loop receives the next read meanwhile); below, inline
THREAD_DECIDE_BYTES = 4 * 1024 * 1024
#: at most one out-of-memory alert per this many seconds while Redis refuses commits
OOM_ALERT_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a run ended with; tests and `fedasync up` read it."""

    version: int
    closed: str | None
    commits: int


class Aggregator:
    """One epoch of the aggregator: restores the last commit and carries on from it."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, keys: Keys) -> None:
        self.settings = settings
        self.redis = redis
        self.keys = keys
        self.state: AggregationState
        self.policy: Policy
        self.committer: Committer
        self.started_at = 0.0
        self._policy_read_at = 0.0
        self._stopping: asyncio.Event | None = None
        self._inflight: asyncio.Task[None] | None = None
        #: the entries the commit in flight acknowledges (never claimed from under it)
        self._inflight_acks: frozenset[bytes] = frozenset()
        self.claims = IdleClaims(redis, keys, settings)
        self._committed_version = -1
        self._closed_committed = False
        self.metrics = AggregatorMetrics()
        self.device_keys = KeyCache(redis, keys, settings.auth.key_refresh_s)
        self.ready = Readiness()
        self._oom_alerted_at = -OOM_ALERT_INTERVAL_S
        #: when Redis began refusing our writes for want of memory (None: it takes them)
        self._oom_since: float | None = None
        claim_dir = settings.wire.claim_check_dir
        #: where claim-check entries' messages are (None: such entries are refused as missing)
        self.claim_store = None if claim_dir is None else ClaimStore(claim_dir)
        #: the messages of the read being decided, fetched by content address ahead of it
        self._claimed: dict[str, bytes | ClaimError] = {}
        archive_dir = settings.aggregator.archive_dir
        #: where payloads go before their commit, then out of Redis (None: they stay)
        self.archive = None if archive_dir is None else PayloadArchive(archive_dir, keys.prefix)
        self._gauges_at = 0.0
        #: cursor in our own pending entries (re-read first after a restart); None once done
        self._backlog: str | None = "0"
        #: a read of new entries failed: it may have delivered entries whose reply was lost
        self._reread_pending = False
        #: the next read, sent before the current one is decided: (its start, its reply)
        self._ahead: tuple[str, asyncio.Task[Any]] | None = None

    # ------------------------------------------------------------------------------ start-up
    async def start(self, initial: AggregationState | None) -> None:
        """Fence off older aggregators, restore (or create) the state, take over pending work.

        Retried as a whole on a transient error: each step is safe to repeat (a second INCR
        only raises the epoch further; the genesis commit is a compare-and-set).
        """
        await retrying(
            "start",
            lambda: self._start(initial),
            self.settings.redis,
            self._stopping,
            on_oom=self._out_of_memory,
        )
        await self._memory_freed()

    async def _out_of_memory(self, exc: BaseException) -> None:
        """Redis refused a write for want of memory (it is retried): count it, and alert at
        most once a minute (the alert itself is a write; it lands once memory is freed)."""
        self.metrics.redis_oom.inc()
        now = time.monotonic()
        if self._oom_since is None:
            self._oom_since = now
        if now - self._oom_alerted_at < OOM_ALERT_INTERVAL_S:
            return
        self._oom_alerted_at = now
        message = (
            f"Redis refused a write of the aggregator for want of memory ({exc}); retrying: "
            'free memory or raise maxmemory (docs/operations.md, "Redis memory")'
        )
        await try_add_alert(self.redis, self.keys, REDIS_OOM, message, time.time())

    async def _memory_freed(self) -> None:
        """A write passed after out-of-memory refusals: say for how long they lasted."""
        if self._oom_since is None:
            return
        lasted, self._oom_since = time.monotonic() - self._oom_since, None
        message = (
            f"Redis refused the aggregator's writes for want of memory for {lasted:.0f} s; "
            "they pass again and deciding goes on (nothing was lost)"
        )
        log.warning("%s", message)
        await try_add_alert(self.redis, self.keys, REDIS_OOM, message, time.time())

    async def _start(self, initial: AggregationState | None) -> None:
        r, keys, cfg = self.redis, self.keys, self.settings.aggregator
        # first: no older aggregator's commit lands now. In durable mode, once the replicas hold
        # the raised epoch they hold all that is read below too: nothing restored from this
        # primary (and announced again below) can be lost to a failover
        durability = self.settings.redis.durability
        # before the epoch: an aggregator started with another task must not fence off the
        # running one on its way to refusing (invalid settings, exit code 2)
        await check_task(r, keys, self.settings.task)
        epoch = int(await replicated(r, durability, lambda c: c.incr(keys.epoch)))
        found = await inspect(r, keys)
        problems = mismatches(found.found)
        if problems:
            await self._refuse(problems)
        seq = found.found.commit_seq
        self.committer = Committer(
            r,
            keys,
            epoch,
            seq,
            cfg.keep_versions,
            receipts=self.settings.receipts.capacity,
            durability=self.settings.redis.durability,
        )
        try:
            await r.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await check_policy_log(r, keys)
        await record_run(r, keys, self.settings.task, self.settings.budget)
        self.policy = await ensure_policy(r, keys, self.settings.policy.to_policy())
        if seq == 0:
            self.state = initial if initial is not None else self._initial_state()
            self.state.dedup.keep_journal(with_current=True)
            # the exact starting point, kept for ever so `ledger verify` can replay from it
            await r.set(keys.genesis, save_state(self.state))
            await self._commit(Batch(b"", 0, b""))
        else:
            try:
                self.state = found.restore()
            except MemoryMissing as exc:  # written by one commit: only a Redis that lost writes
                await self._refuse([Mismatch(Check.MEMORY_MISSING, str(exc))])
            self._committed_version = self.state.version
            self._closed_committed = self.state.closed is not None
            # the version restored is offered again: an announcement lost with a primary (durable
            # mode announces after its commit) or never made (data of an earlier release)
            await self.committer.announce(self.state.version)
        # only once the first commit is acknowledged, and on its own (no transaction): a Redis
        # that later loses its commits but keeps its plain writes shows it beside commit 0
        await r.set(keys.started, repr(time.time()), nx=True)
        self.started_at = float(await r.get(keys.started) or time.time())
        claimed = await self._claim_pending()
        self.metrics.version.set(self.state.version)
        self.metrics.policy_version.set(self.policy.version)
        self.ready.ready = True
        pending: Any = await r.xpending(keys.updates, AGGREGATOR_GROUP)
        log.info(
            "aggregator epoch %d at version %d (commit %d); %d undecided entries to re-read "
            "(%d taken over from other consumers)",
            epoch,
            self.state.version,
            self.committer.seq,
            pending["pending"],
            claimed,
        )

    def _initial_state(self) -> AggregationState:
        task = self.settings.task.build()  # init_weights is numpy only: no torch needed
        weights = task.init_weights(stream(self.settings.task.seed, Stream.MODEL))
        return AggregationState(weights, task.layout, dedup=self._dedup())

    def _dedup(self) -> DedupMemory:
        return DedupMemory(self.settings.dedup.horizon, self.settings.dedup.capacity)

    async def _refuse(self, problems: list[Mismatch]) -> NoReturn:
        """Redis lost writes: say so (log, metric, alert, /readyz) and decide nothing more."""
        for problem in problems:
            self.metrics.state_mismatches.labels(problem.check.value).inc()
        message = "; ".join(str(p) for p in problems)
        log.error(
            "refusing to decide: the state in Redis does not match its ledger, consumer group or "
            "the last commit (Redis lost writes?): %s. See docs/operations.md, "
            '"Redis moved back in time"',
            message,
        )
        self.ready.ready, self.ready.refused = False, message
        await try_add_alert(
            self.redis, self.keys, STATE_MISMATCH, f"refusing to decide: {message}", time.time()
        )
        raise StateMismatch(problems)

    async def _claim_pending(self) -> int:
        """Entries delivered to an earlier aggregator and never acknowledged become ours.

        The earlier one is dead or fenced off (its commits are refused), so no idle time is
        waited for; our own pending entries are re-read from the start anyway.
        """
        me = self.settings.aggregator.consumer
        taken = await claim(self.redis, self.keys, me, min_idle_ms=0, others_only=True)
        return sum(taken.values())

    # ------------------------------------------------------------------------------ the loop
    async def run(self, stopping: asyncio.Event, *, burst: bool = False) -> RunResult:
        """Decide and commit until `stopping` is set (or, in burst mode, the stream is empty)."""
        self._stopping = stopping
        try:
            await self._loop(stopping, burst)
        except (*TRANSIENT, ResponseError) as exc:
            refused = isinstance(exc, ResponseError)
            if not stopping.is_set() or (refused and not is_out_of_memory(exc)):
                raise
            # nothing is lost: whatever was decided but not committed is re-read next time
            why = "Redis is out of memory" if refused else "Redis unreachable"
            log.warning("stopping without a final commit: %s (%s)", why, exc)
        finally:
            if self._ahead is not None:  # what it read stays pending: re-read at the next start
                await cancel_tasks([self._ahead[1]])
            if self._inflight is not None:  # a commit lands whole or not at all: safe to drop
                await cancel_tasks([self._inflight])
            self.metrics.fold()
        return RunResult(self.state.version, self.state.closed, self.committer.seq)

    async def _loop(self, stopping: asyncio.Event, burst: bool) -> None:
        while not stopping.is_set():
            if self._inflight is not None and self._inflight.done():
                # a commit refused (fenced off) or given up surfaces now, not at the next batch:
                # an idle aggregator would otherwise carry on reading, and stranding, entries
                await self._finish_commit()
            await self._claim_idle()
            if self._reread_pending:
                # once the commit in flight lands, our pending entries are exactly those never
                # decided: the ones a lost XREADGROUP reply delivered, or claimed from another
                # consumer. Re-read them like a restart.
                await self._finish_commit()
                self._reread_pending, self._backlog = False, "0"
            await self._refresh_policy()
            if self.policy.paused:  # an operator paused aggregation: leave updates in the stream
                await self._drop_read_ahead()
                if burst:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), POLICY_REFRESH_S)
                continue
            self._check_time_budget()
            batch = Batch(b"", self.state.version, b"")
            deadline = time.monotonic() + self.settings.aggregator.batch_ms / 1000
            while len(batch.acks) < self.settings.aggregator.batch_max:
                backlog = self._backlog is not None
                idle = not (batch.acks or burst or backlog)
                block = self.claims.block_ms() if idle else None
                entries = await self._read(self._backlog or ">", batch, block)
                if backlog and not entries:
                    self._backlog = None  # our pending entries are all decided: new ones next
                    continue
                if not entries or time.monotonic() >= deadline or stopping.is_set():
                    break
            newly_closed = self.state.closed is not None and not self._closed_committed
            if batch.acks or newly_closed:
                self._seal(batch)
                await self._finish_commit()  # commits stay in order: one in flight at most
                # the next batch is read and decided while Redis runs this commit
                self._inflight = asyncio.create_task(self._send(batch), name="commit")
                self._inflight_acks = frozenset(batch.acks)
            elif burst and not self._reread_pending:
                break
            else:  # at rest the figures must come back to 0 too, not stay at the last commit's
                await self._stream_gauges()
        await self._finish_commit()

    # ------------------------------------------------------------------------------ claims
    async def _claim_idle(self) -> None:
        """Take over what sat idle under any consumer (claims.py); re-read it before the next
        batch. Raises `Fenced` once a newer aggregator started, even with nothing to commit.

        Neither the commit in flight's entries nor the read-ahead's are taken: both are this
        aggregator's, on their way (a large read may take longer than `claim_idle_s` to decide)."""
        exclude = self._inflight_acks | await self._read_ahead_ids()
        taken = await self.claims.take(self.committer.epoch, exclude, self._stopping)
        if taken:
            self.metrics.claimed.inc(sum(taken.values()))
            log.warning(
                "took over %d entries idle for %.1f s or more (%s)",
                sum(taken.values()),
                self.settings.aggregator.claim_idle_s,
                ", ".join(f"{n} from {who}" for who, n in sorted(taken.items())),
            )
            self._reread_pending = True

    # ------------------------------------------------------------------------------ reads
    async def _read(self, start: str, batch: Batch, block: int | None) -> int:
        """Read up to the batch's room from `start` (">" or our backlog cursor) and decide it.

        The reply comes from the read-ahead when one was sent for this `start`; while the entries
        are decided (in a worker thread: numpy releases the GIL on large arrays), the next read
        is already on its way, so Redis serves it while we decide.
        """
        cfg = self.settings.aggregator
        room = min(cfg.batch_max - len(batch.acks), cfg.read_count)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == start:
            reply: Any = await ahead[1]
            if not (reply and reply[0][1]) and block is not None:
                reply = await self._xreadgroup(start, room, block)
        else:
            if ahead is not None:  # sent for another start: a re-read from "0" covers it
                await _settle(ahead[1])
            reply = await self._xreadgroup(start, room, block)
        entries: list[tuple[bytes, dict[bytes, bytes] | None]] = reply[0][1] if reply else []
        if entries and self._backlog is not None:
            self._backlog = entries[-1][0].decode()
        if len(entries) >= room and not self._reread_pending:
            # full: more is probably waiting; sized to what the next _read will have room for
            left = cfg.batch_max - len(batch.acks) - len(entries)
            count = min(cfg.read_count, left if left > 0 else cfg.batch_max)
            following = self._backlog or ">"
            self._ahead = (
                following,
                asyncio.create_task(self._xreadgroup(following, count, None), name="read-ahead"),
            )
            # the task writes its command now, so Redis serves it while the entries below are
            # decided (synchronously, for a small read: a task only created would send
            # nothing before the deciding is done)
            await until_sent(self._ahead[1])
        signers = {c for _, fields in entries if (c := _signer(fields)) is not None}
        if signers:  # one round trip for the keys of the whole read, before deciding any
            await retrying(
                "HMGET device keys",
                lambda: self.device_keys.load(signers),
                self.settings.redis,
                self._stopping,
            )
        addresses = {a for _, fields in entries if (a := stream_entry.address_of(fields))}
        self._claimed = await self._fetch_claims(addresses) if addresses else {}
        size = sum(len(stream_entry.message_of(fields) or b"") for _, fields in entries)
        size += sum(len(m) for m in self._claimed.values() if isinstance(m, bytes))
        if size >= THREAD_DECIDE_BYTES:
            await asyncio.to_thread(self._decide_all, entries, batch)
        else:  # small: a thread's hand-over would cost more than the overlap gains
            self._decide_all(entries, batch)
        return len(entries)

    async def _xreadgroup(self, start: str, count: int, block: int | None) -> Any:
        cfg = self.settings.aggregator

        durable = self.settings.redis.durability.replicas > 0

        async def xreadgroup(client: aioredis.Redis) -> Any:
            reply = await client.xreadgroup(
                AGGREGATOR_GROUP,
                cfg.consumer,
                {self.keys.updates: start},
                count=count,
                block=block,
            )
            if durable:
                # a write of nothing (the epoch plus 0) on this connection, so that its WAIT
                # covers every delivery before it: a re-read of pending entries ("0") writes
                # nothing itself, yet their first delivery may not have reached a replica
                await client.incrby(self.keys.epoch, 0)
            return reply

        async def read() -> Any:
            try:
                # durable mode: what a read delivers is on the replicas before it is decided, so
                # a commit retried on a promoted replica finds every entry it acknowledges
                # pending there, and carries on instead of refusing (group-lost-delivery)
                return await replicated(self.redis, self.settings.redis.durability, xreadgroup)
            except TRANSIENT:
                # Redis may have run the read (entries now pending for us) and lost the reply
                # (a timeout, or a crash after the AOF fsync): ">" never delivers those again
                if start == ">":
                    self._reread_pending = True
                raise

        return await retrying("XREADGROUP", read, self.settings.redis, self._stopping)

    async def _read_ahead_ids(self) -> frozenset[bytes]:
        """The entries the read-ahead delivered (waiting for its reply if it is still on its
        way: it is read next anyway); none if there is none, or it failed."""
        if self._ahead is None or not self.claims.due():
            return frozenset()
        task = self._ahead[1]
        await _settle(task)
        if task.cancelled() or task.exception() is not None or not task.result():
            return frozenset()
        return frozenset(entry_id for entry_id, _ in task.result()[0][1])

    async def _fetch_claims(self, addresses: set[str]) -> dict[str, bytes | ClaimError]:
        """The claim-check messages of a read, fetched and checked in a worker thread before
        any of it is decided; without a store each is missing (a rejection, not a crash)."""
        if self.claim_store is None:
            missing = ClaimError("claim_missing", "no claim-check store configured")
            return dict.fromkeys(addresses, missing)
        return await asyncio.to_thread(self.claim_store.fetch, addresses)

    async def _drop_read_ahead(self) -> None:
        """Forget the read-ahead; what it delivered stays pending under this consumer, so the
        backlog is re-read from the start before anything new."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await _settle(ahead[1])
            self._reread_pending = True

    def _decide_all(
        self, entries: list[tuple[bytes, dict[bytes, bytes] | None]], batch: Batch
    ) -> None:
        for stream_id, fields in entries:
            self._decide(stream_id, fields, batch)

    def _decide(self, stream_id: bytes, fields: dict[bytes, bytes] | None, batch: Batch) -> None:
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
                self.metrics.rejections.labels(error.reason).inc()
                log.warning("dead-lettered %s: %s", stream_id.decode(), error)
                return
            raw = claimed
        if raw is None:  # trimmed while pending, or written by something else
            batch.dead.append(DeadLetter("missing_payload", "entry has no message", stream_id, b""))
            self.metrics.rejections.labels("missing_payload").inc()
            return
        try:
            proof = self._authenticate(stream_id, fields or {}, raw)
            update = decode_update(raw, self.settings.wire.max_message_bytes)
            if proof is not None:
                check_claim(proof, update.client_id)
        except (AuthError, WireError) as exc:
            # refused before the core sees it: no dedup entry, so a forgery under a real
            # update id cannot block the genuine update
            keep = raw[: self.settings.aggregator.deadletter_payload_bytes]
            batch.dead.append(DeadLetter(exc.reason.value, exc.detail, stream_id, keep))
            self.metrics.rejections.labels(exc.reason.value).inc()
            log.warning("dead-lettered %s: %s", stream_id.decode(), exc)
            return
        decision = self.state.apply(update, self.policy)
        self.metrics.observe(decision, time.perf_counter() - started)
        record = decision.to_dict() | {"stream_id": stream_id.decode(), "at": time.time()}
        batch.ledger.append(
            LedgerEntry(pack(record), update_digest(update.client_id, update.update_id))
        )
        if self.archive is not None:  # a claim-check message stays in its store: its address
            kept = raw if address is None else ADDRESS_MARK + address.encode()
            batch.archive.append((stream_id, kept))
        if decision.outcome is Outcome.REJECTED:  # invalid content: also a dead letter
            keep = raw[: self.settings.aggregator.deadletter_payload_bytes]
            batch.dead.append(DeadLetter(str(decision.reason), decision.detail, stream_id, keep))
        # applied updates, not versions: a FedBuff version takes K of them
        if not self.state.closed and self.state.applied >= self._max_updates:
            self.state.close("max_updates")
            log.info("budget reached: %d updates applied", self.state.applied)

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
            if exc.reason is AuthReason.UNSIGNED and not self.settings.auth.required:
                return None
            raise
        key = self.device_keys.key_of(proof.client_id)
        window_ms = self.settings.auth.window_ms
        verify(proof, key, raw, stream_id_ms(stream_id), window_ms)
        self.metrics.authenticated.inc()
        return proof

    @property
    def _max_updates(self) -> int:
        return self.settings.budget.limits(self.policy)[0]

    def _check_time_budget(self) -> None:
        elapsed = time.time() - self.started_at
        limit = self.settings.budget.limits(self.policy)[1]
        if not self.state.closed and elapsed >= limit:
            self.state.close("max_seconds")
            log.info("budget reached: %.0f s of training", elapsed)

    async def _refresh_policy(self) -> None:
        """Policy changes take effect between batches: a deterministic, recorded point."""
        now = time.monotonic()
        if now - self._policy_read_at < POLICY_REFRESH_S:
            return
        self._policy_read_at = now
        policy = await retrying(
            "GET policy",
            lambda: read_policy(self.redis, self.keys),
            self.settings.redis,
            self._stopping,
        )
        if policy.version != self.policy.version:
            log.info("policy %d → %d", self.policy.version, policy.version)
            self.policy = policy
            self.metrics.policy_version.set(policy.version)

    def _seal(self, batch: Batch) -> None:
        """Freeze what the commit will write: the state *now*, after exactly this batch.

        Synchronous on purpose: the next batch may be decided while this one is in flight, and
        must not leak into it.
        """
        state = self.state
        # the dedup ids and the clients' remembered deltas go by increments (commit.py), not
        # whole each time
        batch.state = save_state(
            state, include_weights=False, include_dedup_ids=False, include_memory=False
        )
        batch.dedup, batch.dedup_floor = state.dedup.drain(), state.dedup.floor
        changes = state.clients.take_changes()
        for client in sorted(changes):
            entry = state.clients.get(client)
            if entry is not None and entry.delta is not None:
                batch.remember.append((client, entry.delta.tobytes()))
            else:
                batch.forget.append(client)
        self.metrics.remembered.set(len(state.clients))
        self.metrics.memory_bytes.set(state.clients.deltas * state.layout.size * 4)
        batch.version = state.version
        if state.version != self._committed_version:
            snapshot = ModelSnapshot(state.version, state.weights_view(), state.layout)
            batch.model = encode_model(snapshot, created_at=time.time())
        batch.done_reason = state.closed or ""
        self._committed_version = state.version
        self._closed_committed = state.closed is not None

    async def _send(self, batch: Batch) -> None:
        started = time.perf_counter()
        now = time.time()
        if self.archive is not None and batch.archive:
            # durable before the commit: no decision is ever recorded without its payload
            await asyncio.to_thread(self.archive.write, batch.archive)
        try:
            # a retry after a lost reply finds its own commit in place and writes nothing (CAS)
            await retrying(
                f"commit {self.committer.seq + 1}",
                lambda: self.committer.commit(batch, now=now),
                self.settings.redis,
                on_oom=self._out_of_memory,
            )
        except CommitConflict as exc:  # our epoch, yet not what we left: Redis moved under us
            await self._refuse([Mismatch(exc.check, str(exc))])
        if self.committer.durable and batch.model:
            # the replicas hold the commit: only now may devices see its version
            await retrying(
                f"announce {batch.version}",
                lambda: self.committer.announce(batch.version),
                self.settings.redis,
                on_oom=self._out_of_memory,
            )
        await self._memory_freed()
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        self.metrics.commits.inc()
        self.metrics.fold()
        self.metrics.version.set(batch.version)
        await self._stream_gauges()
        trimming = self.archive is not None or not self.settings.aggregator.keep_payloads
        if trimming and batch.acks:
            # never past an entry pending elsewhere: taken over later, it needs its payload
            await best_effort("trim", lambda: trim_decided(self.redis, self.keys, batch.acks[-1]))

    async def _stream_gauges(self) -> None:
        """Stream length, pending and lag, read at most once a second; best-effort."""
        now = time.monotonic()
        if now - self._gauges_at < 1.0:
            return
        self._gauges_at = now
        drift = await best_effort("lag correction", lambda: correct_lag(self.redis, self.keys))
        if drift:
            log.warning(
                "Redis reported a lag of %d with every entry read (its entries-read counter "
                "drifts across restarts and failovers on Redis 7.0): corrected",
                drift,
            )
        backlog = await best_effort("stream gauges", lambda: read_backlog(self.redis, self.keys))
        if backlog is None:
            return
        self.metrics.pending.set(backlog.pending)
        self.metrics.lag.set(backlog.lag)
        self.metrics.stream_length.set(backlog.length)

    async def _finish_commit(self) -> None:
        """Wait for the commit in flight; its failure (e.g. Fenced) surfaces here."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            await inflight
        self._inflight_acks = frozenset()

    async def _commit(self, batch: Batch) -> None:
        self._seal(batch)
        await self._finish_commit()
        await self._send(batch)


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a read whose reply is no longer wanted, whatever it ended with: what it
    delivered stays pending under this consumer, re-read from "0" (and a Redis that is away
    fails the read that comes next)."""
    with contextlib.suppress(Exception):
        await task


def _signer(fields: dict[bytes, bytes] | None) -> str | None:
    """The client id an entry claims to be signed by, if readable (checked later, not here)."""
    client = (fields or {}).get(b"c")
    if client is None:
        return None
    try:
        return client.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    initial: AggregationState | None = None,
    handle_signals: bool = True,
    burst: bool = False,
    stopping: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
) -> RunResult:
    """Run one aggregator until stopped; tests pass their own client and use burst mode.

    `started` receives the bound port of the metrics server (when it has one)."""
    stopping = stopping or asyncio.Event()
    client = redis if redis is not None else connect(settings.redis)
    aggregator = Aggregator(settings, client, Keys(settings.redis.key_prefix))
    cfg = settings.aggregator
    try:
        with stop_on_signals(stopping, handle_signals):
            async with contextlib.AsyncExitStack() as http:
                listening_http = False
                if cfg.port is not None and not burst:
                    app = create_app(aggregator.metrics, aggregator.ready, client)
                    port = await http.enter_async_context(
                        listening("aggregator metrics", app, cfg.host, cfg.port, settings.http)
                    )
                    listening_http = True
                    log.info("metrics on http://%s:%d/metrics", cfg.host, port)
                    if started is not None:
                        started.set_result(port)
                try:
                    await aggregator.start(initial)
                    return await aggregator.run(stopping, burst=burst)
                except StateMismatch:
                    if listening_http:
                        await _linger(stopping, cfg.refusal_linger_s)
                    raise
    finally:
        if redis is None:
            await client.aclose()


async def _linger(stopping: asyncio.Event, seconds: float) -> None:
    """Keep the HTTP side up for a while after a refusal, so the metric is scraped and /readyz
    says why; a stop request ends it at once. The default, 30 s, is two scrapes at
    Prometheus's default 15 s, and paces a restart loop (compose's `restart: unless-stopped`)
    to one refusal, one alert, every half minute (FEDASYNC_AGGREGATOR__REFUSAL_LINGER_S)."""
    log.error("exiting with code 4 in %.0f s (or when stopped)", seconds)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
