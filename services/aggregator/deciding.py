"""Deciding one read: each entry prepared (found, authenticated, decoded), then applied.

Preparing (services/aggregator/preparing.py) needs no state: in one-process mode it runs here,
in process mode (`aggregator.reader = "process"`) in the reader process, which hands the
prepared entries over through shared memory (services/aggregator/feed.py). Deciding is the same
in both: the decisions go into the batch the commit pipeline writes
(services/aggregator/pipeline.py): the acknowledgement, the ledger record, the payload to
archive, or a dead letter for an entry refused before the core sees it (unsigned, forged,
undecodable, a claim-check message missing). A large read is decided in a worker thread (numpy
releases the GIL on large arrays) so the event loop receives the next read meanwhile. The state
is closed here when the budget of applied updates or of time is spent.
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
from fedasync.services.aggregator.preparing import Prepared, Preparer, Refused
from fedasync.services.aggregator.reader import Entry
from fedasync.services.runtime.settings import Problem, Settings, SettingsError, TaskSettings
from fedasync.services.stores.archive import ADDRESS_MARK
from fedasync.services.stores.claim_check import ClaimSource
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.ingest_markers import IngestMarkers
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Outcome
from fedasync.shared.device_privacy import reported
from fedasync.shared.keys import update_digest
from fedasync.shared.policy import Policy
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.wire import pack


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
        #: finds, checks and decodes entries (here in one-process mode, and for entries the
        #: reader process could not fit in a slot)
        self.preparer = Preparer(settings, device_keys, markers, claim_store)
        #: whether payloads are archived before their commit (the batch carries them)
        self._archiving = archiving
        #: Zeno++'s validation gradient at given weights, built at its first use
        self._gradient_at: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def device_keys(self) -> KeyCache:
        """The devices' public keys the preparing checks signatures with."""
        return self.preparer.device_keys

    @device_keys.setter
    def device_keys(self, cache: KeyCache) -> None:
        self.preparer.device_keys = cache

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
        """Prepare the read (services/aggregator/preparing.py: its signers' keys, its
        claim-check messages, its signatures, its decoding), then decide it, in a worker thread
        when it is large."""
        prepared, threaded = await self.preparer.prepare(entries, stopping)
        await self.decide_prepared(prepared, batch, policy, threaded)

    async def decide_prepared(
        self, items: list[Prepared], batch: Batch, policy: Policy, threaded: bool
    ) -> None:
        """Decide prepared entries (from `decide_read`, or from the reader process), in order;
        in a worker thread when `threaded` (a large read: the event loop runs meanwhile)."""
        if threaded:
            await asyncio.to_thread(self.decide_all, items, batch, policy)
        else:  # small: a thread's hand-over would cost more than the overlap gains
            self.decide_all(items, batch, policy)

    def decide_all(self, items: list[Prepared], batch: Batch, policy: Policy) -> None:
        for item in items:
            self._decide(item, batch, policy)

    def _decide(self, item: Prepared, batch: Batch, policy: Policy) -> None:
        started = time.perf_counter()
        stream_id = item.stream_id
        batch.acks.append(stream_id)
        if item.authenticated:
            self._metrics.authenticated.inc()
        if isinstance(item, Refused):
            batch.dead.append(DeadLetter(item.reason, item.detail, stream_id, item.payload))
            self._metrics.rejections.labels(item.reason).inc()
            if item.warning is not None:
                log.warning("dead-lettered %s: %s", stream_id.decode(), item.warning)
            return
        update, raw, address = item.update, item.raw, item.address
        cfg = self._settings.aggregator
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
