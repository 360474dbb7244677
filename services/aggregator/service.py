"""The aggregator: the single consumer of the updates stream, a thin adapter around the core.

Read a few entries, decide each through `AggregationState.apply`, then commit the decisions, the
new model and the acknowledgements together (services/aggregator/commit.py). Nothing is
acknowledged before its decision is durable, and a decision is durable only with the state it
produced, so a kill -9 at any instant loses nothing and applies nothing twice: on restart the
last commit is restored and the entries it did not cover are decided again, from that state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.commit import Batch, Committer, DeadLetter
from fedasync.services.aggregator.http import create_app
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.http_service import listening
from fedasync.services.runtime.lifecycle import cancel_tasks, stop_on_signals
from fedasync.services.runtime.redis_conn import TRANSIENT, connect, get_bytes, retrying
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.backlog import read_backlog
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys
from fedasync.services.stores.policy_store import ensure_policy, read_policy
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState, ModelSnapshot
from fedasync.shared.checkpoint import load_state, save_state
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
from fedasync.shared.model_format import decode_model, encode_model
from fedasync.shared.policy import Policy
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.wire import WireError, decode_update, pack

log = logging.getLogger(__name__)

#: how often the policy record is re-read between batches, seconds
POLICY_REFRESH_S = 0.2


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
        self._committed_version = -1
        self._closed_committed = False
        self.metrics = AggregatorMetrics()
        self.device_keys = KeyCache(redis, keys, settings.auth.key_refresh_s)
        self.ready = [False]
        self._gauges_at = 0.0
        #: cursor in our own pending entries (re-read first after a restart); None once done
        self._backlog: str | None = "0"
        #: a read of new entries failed: it may have delivered entries whose reply was lost
        self._reread_pending = False

    # ------------------------------------------------------------------------------ start-up
    async def start(self, initial: AggregationState | None) -> None:
        """Fence off older aggregators, restore (or create) the state, take over pending work."""
        r, keys, cfg = self.redis, self.keys, self.settings.aggregator
        epoch = int(await r.incr(keys.epoch))
        seq = int(await r.get(keys.commit_seq) or 0)
        self.committer = Committer(
            r, keys, epoch, seq, cfg.keep_versions, self.settings.redis.reconnect_attempts
        )
        try:
            await r.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.policy = await ensure_policy(r, keys, self.settings.policy.to_policy())
        await r.set(keys.started, repr(time.time()), nx=True)
        self.started_at = float(await r.get(keys.started) or time.time())
        if seq == 0:
            self.state = initial if initial is not None else self._initial_state()
            # the exact starting point, kept for ever so `ledger verify` can replay from it
            await r.set(keys.genesis, save_state(self.state))
            await self._commit(Batch(b"", 0, b""))
        else:
            self.state = await self._restore()
            self._committed_version = self.state.version
            self._closed_committed = self.state.closed is not None
        claimed = await self._claim_pending()
        self.metrics.version.set(self.state.version)
        self.metrics.policy_version.set(self.policy.version)
        self.ready[0] = True
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
        from fedasync.learning.tasks import (
            get_task,  # numpy only: no torch needed to build the model
        )

        task = get_task(self.settings.task.name)
        weights = task.init_weights(stream(self.settings.task.seed, Stream.MODEL))
        return AggregationState(weights, task.layout, dedup=self._dedup())

    def _dedup(self) -> DedupMemory:
        return DedupMemory(self.settings.dedup.horizon, self.settings.dedup.capacity)

    async def _restore(self) -> AggregationState:
        raw_state = await get_bytes(self.redis, self.keys.state)
        version = int(await get_bytes(self.redis, self.keys.version) or 0)
        raw_model = await get_bytes(self.redis, self.keys.model(version))
        if raw_state is None or raw_model is None:
            raise RuntimeError(f"commit found but state or model {version} is missing in Redis")
        model = decode_model(raw_model, max_bytes=len(raw_model))
        return load_state(raw_state, weights=model.snapshot.weights)

    async def _claim_pending(self) -> int:
        """Entries delivered to an earlier aggregator and never acknowledged become ours.

        The earlier one is dead or fenced off (its commits are refused), so no idle time is
        waited for. XPENDING + XCLAIM JUSTID moves ids only, never payloads.
        """
        me, start, claimed = self.settings.aggregator.consumer, "-", 0
        while True:
            pending: Any = await self.redis.xpending_range(
                self.keys.updates, AGGREGATOR_GROUP, min=start, max="+", count=1000
            )
            theirs = [p["message_id"] for p in pending if p["consumer"].decode() != me]
            if theirs:
                await self.redis.xclaim(
                    self.keys.updates, AGGREGATOR_GROUP, me, 0, theirs, justid=True
                )
                claimed += len(theirs)
            if len(pending) < 1000:
                return claimed
            start = "(" + pending[-1]["message_id"].decode()

    # ------------------------------------------------------------------------------ the loop
    async def run(self, stopping: asyncio.Event, *, burst: bool = False) -> RunResult:
        """Decide and commit until `stopping` is set (or, in burst mode, the stream is empty)."""
        self._stopping = stopping
        try:
            await self._loop(stopping, burst)
        except TRANSIENT as exc:
            if not stopping.is_set():
                raise
            # nothing is lost: whatever was decided but not committed is re-read next time
            log.warning("stopping without a final commit: Redis unreachable (%s)", exc)
        finally:
            if self._inflight is not None:  # a commit lands whole or not at all: safe to drop
                await cancel_tasks([self._inflight])
        return RunResult(self.state.version, self.state.closed, self.committer.seq)

    async def _loop(self, stopping: asyncio.Event, burst: bool) -> None:
        while not stopping.is_set():
            if self._reread_pending:
                # once the commit in flight lands, our pending entries are exactly those never
                # decided: the ones a lost XREADGROUP reply delivered. Re-read them like a restart.
                await self._finish_commit()
                self._reread_pending, self._backlog = False, "0"
            await self._refresh_policy()
            if self.policy.paused:  # an operator paused aggregation: leave updates in the stream
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
                block = self.settings.aggregator.block_ms if idle else None
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
            elif burst and not self._reread_pending:
                break
        await self._finish_commit()

    async def _read(self, start: str, batch: Batch, block: int | None) -> int:
        cfg = self.settings.aggregator
        room = min(cfg.batch_max - len(batch.acks), cfg.read_count)

        async def read() -> Any:
            try:
                return await self.redis.xreadgroup(
                    AGGREGATOR_GROUP,
                    cfg.consumer,
                    {self.keys.updates: start},
                    count=room,
                    block=block,
                )
            except TRANSIENT:
                # Redis may have run the read (entries now pending for us) and lost the reply
                # (a timeout, or a crash after the AOF fsync): ">" never delivers those again
                if start == ">":
                    self._reread_pending = True
                raise

        reply: Any = await retrying("XREADGROUP", read, self.settings.redis, self._stopping)
        entries: list[tuple[bytes, dict[bytes, bytes] | None]] = reply[0][1] if reply else []
        signers = {c for _, fields in entries if (c := _signer(fields)) is not None}
        if signers:  # one round trip for the keys of the whole read, before deciding any
            await retrying(
                "HMGET device keys",
                lambda: self.device_keys.load(signers),
                self.settings.redis,
                self._stopping,
            )
        for stream_id, fields in entries:
            self._decide(stream_id, fields, batch)
        if entries and self._backlog is not None:
            self._backlog = entries[-1][0].decode()
        return len(entries)

    def _decide(self, stream_id: bytes, fields: dict[bytes, bytes] | None, batch: Batch) -> None:
        started = time.perf_counter()
        batch.acks.append(stream_id)
        raw = stream_entry.message_of(fields)
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
        batch.ledger.append(pack(record))
        if decision.outcome is Outcome.REJECTED:  # invalid content: also a dead letter
            keep = raw[: self.settings.aggregator.deadletter_payload_bytes]
            batch.dead.append(DeadLetter(str(decision.reason), decision.detail, stream_id, keep))
        if not self.state.closed and self.state.version >= self._max_updates:
            self.state.close("max_updates")
            log.info("budget reached: %d updates applied", self.state.version)

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
        window_ms = round(self.settings.auth.window_s * 1000)
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
        batch.state = save_state(state, include_weights=False)
        batch.version = state.version
        if state.version != self._committed_version:
            snapshot = ModelSnapshot(state.version, state.weights_view(), state.layout)
            batch.model = encode_model(snapshot, created_at=time.time())
        batch.done_reason = state.closed or ""
        self._committed_version = state.version
        self._closed_committed = state.closed is not None

    async def _send(self, batch: Batch) -> None:
        started = time.perf_counter()
        await self.committer.commit(batch, now=time.time())
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        self.metrics.commits.inc()
        self.metrics.version.set(batch.version)
        await self._stream_gauges()
        if not self.settings.aggregator.keep_payloads and batch.acks:
            # everything up to the last acknowledged entry is decided and durable
            await self.redis.xtrim(self.keys.updates, minid=batch.acks[-1], approximate=False)

    async def _stream_gauges(self) -> None:
        """Stream length, pending and lag, read at most once a second (one round trip)."""
        now = time.monotonic()
        if now - self._gauges_at < 1.0:
            return
        self._gauges_at = now
        backlog = await read_backlog(self.redis, self.keys)
        self.metrics.pending.set(backlog.pending)
        self.metrics.lag.set(backlog.lag)
        self.metrics.stream_length.set(backlog.length)

    async def _finish_commit(self) -> None:
        """Wait for the commit in flight; its failure (e.g. Fenced) surfaces here."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            await inflight

    async def _commit(self, batch: Batch) -> None:
        self._seal(batch)
        await self._finish_commit()
        await self._send(batch)


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
                if cfg.port is not None and not burst:
                    app = create_app(aggregator.metrics, aggregator.ready)
                    port = await http.enter_async_context(
                        listening("aggregator metrics", app, cfg.host, cfg.port, settings.http)
                    )
                    log.info("metrics on http://%s:%d/metrics", cfg.host, port)
                    if started is not None:
                        started.set_result(port)
                await aggregator.start(initial)
                return await aggregator.run(stopping, burst=burst)
    finally:
        if redis is None:
            await client.aclose()
