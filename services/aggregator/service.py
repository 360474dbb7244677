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

This module wires the parts and runs the loop; each part is a module of its own: the reads
(reader.py), the deciding (deciding.py), the commit pipeline (pipeline.py), the policy refresh
(policy_refresh.py), the out-of-memory handling (memory_pressure.py), the refusal
(refusal.py), the stream gauges (stream_gauges.py) and the takeover of idle entries (claims.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.claims import IdleClaims, claim
from fedasync.services.aggregator.commit import Batch, Committer
from fedasync.services.aggregator.deciding import Decider
from fedasync.services.aggregator.feed import ProcessFeed
from fedasync.services.aggregator.http import Readiness, create_app
from fedasync.services.aggregator.inspection import StateMismatch, inspect
from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.memory_pressure import MemoryPressure
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.pipeline import CommitPipeline
from fedasync.services.aggregator.policy_refresh import POLICY_REFRESH_S, PolicyRefresh
from fedasync.services.aggregator.reader import Reader
from fedasync.services.aggregator.refusal import Refusal
from fedasync.services.aggregator.stream_gauges import StreamGauges
from fedasync.services.runtime.http_service import listening
from fedasync.services.runtime.lifecycle import stop_on_signals
from fedasync.services.runtime.redis_conn import (
    TRANSIENT,
    connect,
    is_out_of_memory,
    replicated,
    retrying,
)
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.archive import PayloadArchive
from fedasync.services.stores.claim_check import claim_source
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.dp_secret import ensure_secret
from fedasync.services.stores.ingest_markers import IngestMarkers
from fedasync.services.stores.policy_store import check_policy_log, ensure_policy
from fedasync.services.stores.run_record import check_task, record_run
from fedasync.services.stores.runs import register
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import MemoryMissing, save_state
from fedasync.shared.continuity import Check, Mismatch, mismatches
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.policy import Policy
from fedasync.shared.runs import is_run_id
from fedasync.shared.seeds import Stream, stream


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
        self.started_at = 0.0
        self._stopping: asyncio.Event | None = None
        self.metrics = metrics = AggregatorMetrics(keys.prefix)
        self.ready = Readiness()
        self.claims = IdleClaims(redis, keys, settings)
        self.memory = MemoryPressure(redis, keys, metrics)
        self.refusal = Refusal(redis, keys, metrics, self.ready)
        self.gauges = StreamGauges(redis, keys, metrics)
        self.reader = Reader(redis, keys, settings)
        self.policy_refresh = PolicyRefresh(redis, keys, settings.redis, metrics)
        wire = settings.wire
        archive_dir = settings.aggregator.archive_dir
        archive = None if archive_dir is None else PayloadArchive(archive_dir, keys.prefix)
        self.decider = Decider(
            settings,
            metrics,
            KeyCache(redis, keys, settings.auth.key_refresh_s),
            IngestMarkers(redis, keys),
            claim_source(wire.claim_check_store, wire.claim_check_dir, redis, keys.prefix),
            archiving=archive is not None,
        )
        #: process mode: the reader process and its ring (None: one process reads and decides)
        self.feed = (
            ProcessFeed(settings, redis, keys, self.decider.preparer, archive is not None)
            if settings.aggregator.reader == "process"
            else None
        )
        self.pipeline = CommitPipeline(
            redis,
            keys,
            settings,
            metrics=metrics,
            memory=self.memory,
            refusal=self.refusal,
            gauges=self.gauges,
            archive=archive,
        )

    @property
    def state(self) -> AggregationState:
        """The state decided from (the decider's), restored or created by `start`."""
        return self.decider.state

    @property
    def policy(self) -> Policy:
        """The policy the next batch is decided under."""
        return self.policy_refresh.policy

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
            on_oom=self.memory.refused,
        )
        await self.memory.passed()

    async def _start(self, initial: AggregationState | None) -> None:
        r, keys, cfg = self.redis, self.keys, self.settings.aggregator
        # first: no older aggregator's commit lands now. In durable mode, once the replicas hold
        # the raised epoch they hold all that is read below too: nothing restored from this
        # primary (and announced again below) can be lost to a failover
        durability = self.settings.redis.durability
        # before the epoch: an aggregator started with another task must not fence off the
        # running one on its way to refusing (invalid settings, exit code 2)
        await check_task(r, keys, self.settings.task)
        # its run in the directory of runs (HSETNX: an entry there stays as it is), so a run
        # whose entry was lost (a crash between its spec and its entry) is listed again; a
        # prefix outside the run-id grammar (a deployment from before runs) is no run to list
        if is_run_id(keys.prefix):
            await register(r, keys.prefix, time.time(), "aggregator")
        else:
            log.info("key prefix %r is not a run id: not listed in the directory", keys.prefix)
        epoch = int(await replicated(r, durability, lambda c: c.incr(keys.epoch), key=keys.epoch))
        found = await inspect(r, keys)
        problems = mismatches(found.found)
        if problems:
            await self.refusal.refuse(problems)
        seq = found.found.commit_seq
        committer = Committer(
            r,
            keys,
            epoch,
            seq,
            cfg.keep_versions,
            receipts=self.settings.receipts.capacity,
            durability=self.settings.redis.durability,
        )
        self.pipeline.begin(committer)
        try:
            await r.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await check_policy_log(r, keys)
        await record_run(r, keys, self.settings.task, self.settings.budget)
        self.policy_refresh.policy = await ensure_policy(r, keys, self.settings.policy.to_policy())
        # made once per run, whether or not DP is on now: a policy may turn it on later
        secret, made = await ensure_secret(r, keys, durability, _secret_of(initial))
        if seq > 0 and made and self.policy.dp_clip is not None:
            log.warning(
                "differential privacy is on and %s was missing at commit %d: a new noise secret "
                "is made; `ledger verify` cannot reproduce the noise of the steps before it",
                keys.dp_secret,
                seq,
            )
        if seq == 0:
            if initial is None:
                state = self._initial_state(secret)
            else:
                state = initial
                if state.dp_secret not in (None, secret):
                    raise ValueError(f"the initial state's noise secret is not {keys.dp_secret}")
                state.dp_secret = secret
            self.decider.state = state
            state.dedup.keep_journal(with_current=True)
            # the exact starting point, kept for ever so `ledger verify` can replay from it
            await r.set(keys.genesis, save_state(state))
            await self.pipeline.commit(Batch(b"", 0, b""), state)
        else:
            try:
                state = self.decider.state = found.restore(dp_secret=secret)
            except MemoryMissing as exc:  # written by one commit: only a Redis that lost writes
                await self.refusal.refuse([Mismatch(Check.MEMORY_MISSING, str(exc))])
            self.pipeline.restored(state)
            # the version restored is offered again: an announcement lost with a primary (durable
            # mode announces after its commit) or never made (data of an earlier release)
            await committer.announce(state.version)
        # only once the first commit is acknowledged, and on its own (no transaction): a Redis
        # that later loses its commits but keeps its plain writes shows it beside commit 0
        await r.set(keys.started, repr(time.time()), nx=True)
        self.started_at = float(await r.get(keys.started) or time.time())
        claimed = await self._claim_pending()
        self.metrics.version.set(self.state.version)
        self.metrics.policy_version.set(self.policy.version)
        self.metrics.spent(*self.state.epsilon(self.policy))
        self.ready.ready = True
        pending: Any = await r.xpending(keys.updates, AGGREGATOR_GROUP)
        log.info(
            "aggregator epoch %d at version %d (commit %d); %d undecided entries to re-read "
            "(%d taken over from other consumers)",
            epoch,
            self.state.version,
            self.pipeline.committer.seq,
            pending["pending"],
            claimed,
        )

    def _initial_state(self, secret: bytes) -> AggregationState:
        task = self.settings.task.build()  # init_weights is numpy only: no torch needed
        weights = task.init_weights(stream(self.settings.task.seed, Stream.MODEL))
        dedup = DedupMemory(self.settings.dedup.horizon, self.settings.dedup.capacity)
        return AggregationState(weights, task.layout, dedup=dedup, dp_secret=secret)

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
            if self.feed is not None and not self.feed.alive():  # (a bench starts it ahead)
                self.feed.start(self.state.layout.size)
            await self._loop(stopping, burst)
        except (*TRANSIENT, ResponseError) as exc:
            refused = isinstance(exc, ResponseError)
            if not stopping.is_set() or (refused and not is_out_of_memory(exc)):
                raise
            # nothing is lost: whatever was decided but not committed is re-read next time
            why = "Redis is out of memory" if refused else "Redis unreachable"
            log.warning("stopping without a final commit: %s (%s)", why, exc)
        finally:
            if self.feed is not None:
                await self.feed.stop()
            await self.reader.cancel_ahead()
            await self.pipeline.cancel()
            self.metrics.fold()
        return RunResult(self.state.version, self.state.closed, self.pipeline.committer.seq)

    async def _loop(self, stopping: asyncio.Event, burst: bool) -> None:
        reader, pipeline, cfg = self.reader, self.pipeline, self.settings.aggregator
        while not stopping.is_set():
            if pipeline.landed_or_failed():
                # a commit refused (fenced off) or given up surfaces now, not at the next batch:
                # an idle aggregator would otherwise carry on reading, and stranding, entries
                await pipeline.finish()
            await self._claim_idle()
            if reader.reread_pending and self.feed is None:
                # once the commit in flight lands, our pending entries are exactly those never
                # decided: the ones a lost XREADGROUP reply delivered, or claimed from another
                # consumer. Re-read them like a restart.
                await pipeline.finish()
                reader.reread_backlog()
            elif self.feed is not None and (reader.reread_pending or self.feed.restart_needed):
                # the same in process mode: the reader died, or entries were taken over (their
                # ids may be below those it published). Once the commit lands, a new reader
                # re-reads our pending entries, exactly the undecided ones, from "0"
                await pipeline.finish()
                reader.reread_pending = False
                await self.feed.restart()
            await self.policy_refresh.refresh(self._stopping)
            policy = self.policy
            # an operator paused aggregation: leave updates in the stream (a stop still closes)
            if policy.paused and not policy.stopped:
                await reader.drop_ahead()
                if burst:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), POLICY_REFRESH_S)
                continue
            self.decider.close_if_out_of_time(policy, self.started_at)
            batch = Batch(b"", self.state.version, b"")
            deadline = time.monotonic() + cfg.batch_ms / 1000
            while self.feed is not None and len(batch.acks) < cfg.batch_max:
                # process mode: the reader process read and prepared these, in stream order
                room = min(cfg.read_count, cfg.batch_max - len(batch.acks))
                idle = not (batch.acks or burst)
                wait = (
                    None
                    if burst
                    else self.claims.block_ms() / 1000
                    if idle
                    else deadline - time.monotonic()
                )
                items, threaded = await self.feed.take(
                    room, wait, self._stopping, until_caught_up=not idle
                )
                await self.decider.decide_prepared(items, batch, policy, threaded)
                if not items or time.monotonic() >= deadline or stopping.is_set():
                    break
            while self.feed is None and len(batch.acks) < cfg.batch_max:
                backlog = reader.in_backlog
                idle = not (batch.acks or burst or backlog)
                block = self.claims.block_ms() if idle else None
                entries = await reader.read(reader.start, len(batch.acks), block, self._stopping)
                await self.decider.decide_read(entries, batch, policy, self._stopping)
                if backlog and not entries:
                    reader.backlog_done()  # our pending entries are all decided: new ones next
                    continue
                if not entries or time.monotonic() >= deadline or stopping.is_set():
                    break
            if batch.acks or pipeline.newly_closed(self.state):
                # the next batch is read and decided while Redis runs this commit
                await pipeline.submit(batch, self.state)
            elif burst and not reader.reread_pending and not self._restart_due():
                break
            else:  # at rest the figures must come back to 0 too, not stay at the last commit's
                await self.gauges.update()
        await pipeline.finish()

    async def _claim_idle(self) -> None:
        """Take over what sat idle under any consumer (claims.py); re-read it before the next
        batch. Raises `Fenced` once a newer aggregator started, even with nothing to commit.

        Neither the commit in flight's entries nor the read-ahead's are taken: both are this
        aggregator's, on their way (a large read may take longer than `claim_idle_s` to decide)."""
        ahead = await self.reader.ahead_ids() if self.claims.due() else frozenset()
        if self.feed is not None and self.claims.due():  # and what the reader's ring holds
            ahead |= self.feed.held_ids()
        exclude = self.pipeline.inflight_acks | ahead
        taken = await self.claims.take(self.pipeline.committer.epoch, exclude, self._stopping)
        if taken:
            self.metrics.claimed.inc(sum(taken.values()))
            log.warning(
                "took over %d entries idle for %.1f s or more (%s)",
                sum(taken.values()),
                self.settings.aggregator.claim_idle_s,
                ", ".join(f"{n} from {who}" for who, n in sorted(taken.items())),
            )
            self.reader.reread_pending = True

    def _restart_due(self) -> bool:
        """Process mode: whether the reader is to be restarted (it died with entries pending)."""
        return self.feed is not None and self.feed.restart_needed


def _secret_of(initial: AggregationState | None) -> bytes | None:
    """The noise secret a caller's initial state was made with (a test replaying the simulator
    bit for bit): the run's, if the run has none yet. A run that has one refuses another."""
    return None if initial is None else initial.dp_secret


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
                    app = create_app(
                        aggregator.metrics, aggregator.ready, client, aggregator.keys.state
                    )
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
