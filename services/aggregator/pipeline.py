"""The commit pipeline: batches sealed in order, one commit in flight while the next is decided.

A batch is sealed synchronously, the moment its deciding ends: the state *now*, after exactly
this batch, so the next batch (decided while this one's commit runs) never leaks into it. The
commit (services/aggregator/commit.py) writes the decisions, the new model and the
acknowledgements together; at most one is in flight, so commits land in order, and a failure
(fenced off, given up) surfaces before the next is sent. After a commit: in durable mode the
version is announced once the replicas hold it, the gauges are read, and decided payloads are
trimmed from the stream (best-effort: never a reason to stop deciding).
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Batch, CommitConflict, Committer
from fedasync.services.aggregator.memory_pressure import MemoryPressure
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.refusal import Refusal
from fedasync.services.aggregator.stream_gauges import StreamGauges
from fedasync.services.runtime.lifecycle import cancel_tasks
from fedasync.services.runtime.redis_conn import best_effort, retrying
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.archive import PayloadArchive
from fedasync.services.stores.backlog import trim_decided
from fedasync.shared.aggregation import AggregationState, ModelSnapshot
from fedasync.shared.checkpoint import save_state
from fedasync.shared.continuity import Mismatch
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import encode_model


class CommitPipeline:
    """Seals batches and sends their commits, in order, at most one in flight."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        settings: Settings,
        *,
        metrics: AggregatorMetrics,
        memory: MemoryPressure,
        refusal: Refusal,
        gauges: StreamGauges,
        archive: PayloadArchive | None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        #: this epoch's commit script runner (`begin`, at each start)
        self.committer: Committer
        self._metrics = metrics
        self._memory = memory
        self._refusal = refusal
        self._gauges = gauges
        #: where payloads go before their commit, then out of Redis (None: they stay)
        self._archive = archive
        self._inflight: asyncio.Task[None] | None = None
        #: the entries the commit in flight acknowledges (never claimed from under it)
        self.inflight_acks: frozenset[bytes] = frozenset()
        #: the version and the close the last sealed batch holds (a new version carries its
        #: model; a close is committed once)
        self._committed_version = -1
        self._closed_committed = False

    def begin(self, committer: Committer) -> None:
        """Commit through `committer`: this start's epoch, from the commit sequence found.

        Each start attempt begins knowing nothing committed: an attempt whose genesis commit
        never landed must not leave the next one believing version 0's model is in Redis (it
        would seal version 0 without its model).
        """
        self.committer = committer
        self._committed_version = -1
        self._closed_committed = False

    def restored(self, state: AggregationState) -> None:
        """`state` is what the last commit holds: its version and close are committed."""
        self._committed_version = state.version
        self._closed_committed = state.closed is not None

    def newly_closed(self, state: AggregationState) -> bool:
        """Whether `state` was closed since the last batch sealed (its close is still to commit)."""
        return state.closed is not None and not self._closed_committed

    def seal(self, batch: Batch, state: AggregationState) -> None:
        """Freeze what the commit will write: the state *now*, after exactly this batch.

        Synchronous on purpose: the next batch may be decided while this one is in flight, and
        must not leak into it.
        """
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
        self._metrics.remembered.set(len(state.clients))
        self._metrics.memory_bytes.set(state.clients.deltas * state.layout.size * 4)
        batch.version = state.version
        if state.version != self._committed_version:
            snapshot = ModelSnapshot(state.version, state.weights_view(), state.layout)
            batch.model = encode_model(snapshot, created_at=time.time())
        batch.done_reason = state.closed or ""
        self._committed_version = state.version
        self._closed_committed = state.closed is not None

    async def commit(self, batch: Batch, state: AggregationState) -> None:
        """Seal `batch` and commit it now, after the commit in flight (the genesis commit)."""
        self.seal(batch, state)
        await self.finish()
        await self.send(batch)

    async def submit(self, batch: Batch, state: AggregationState) -> None:
        """Seal `batch` and send its commit in the background, once the one in flight landed:
        the next batch is read and decided while Redis runs this commit."""
        self.seal(batch, state)
        await self.finish()  # commits stay in order: one in flight at most
        self._inflight = asyncio.create_task(self.send(batch), name="commit")
        self.inflight_acks = frozenset(batch.acks)

    def landed_or_failed(self) -> bool:
        """Whether the commit in flight is done: its failure is to surface now."""
        return self._inflight is not None and self._inflight.done()

    async def finish(self) -> None:
        """Wait for the commit in flight; its failure (e.g. Fenced) surfaces here."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            await inflight
        self.inflight_acks = frozenset()

    async def cancel(self) -> None:
        """The run ends: drop the commit in flight (it lands whole or not at all: safe)."""
        if self._inflight is not None:
            await cancel_tasks([self._inflight])

    async def send(self, batch: Batch) -> None:
        started = time.perf_counter()
        now = time.time()
        if self._archive is not None and batch.archive:
            # durable before the commit: no decision is ever recorded without its payload
            await asyncio.to_thread(self._archive.write, batch.archive)
        committer = self.committer
        try:
            # a retry after a lost reply finds its own commit in place and writes nothing (CAS)
            await retrying(
                f"commit {committer.seq + 1}",
                lambda: committer.commit(batch, now=now),
                self._settings.redis,
                on_oom=self._memory.refused,
            )
        except CommitConflict as exc:  # our epoch, yet not what we left: Redis moved under us
            await self._refusal.refuse([Mismatch(exc.check, str(exc))])
        if committer.durable and batch.model:
            # the replicas hold the commit: only now may devices see its version
            await retrying(
                f"announce {batch.version}",
                lambda: committer.announce(batch.version),
                self._settings.redis,
                on_oom=self._memory.refused,
            )
        await self._memory.passed()
        self._metrics.commit_seconds.observe(time.perf_counter() - started)
        self._metrics.commits.inc()
        self._metrics.fold()
        self._metrics.version.set(batch.version)
        await self._gauges.update()
        trimming = self._archive is not None or not self._settings.aggregator.keep_payloads
        if trimming and batch.acks:
            # never past an entry pending elsewhere: taken over later, it needs its payload
            await best_effort("trim", lambda: trim_decided(self._redis, self._keys, batch.acks[-1]))
