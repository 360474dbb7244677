"""Prometheus metrics of the aggregator: the figures the write-up says matter.

τ and α distributions, decisions by outcome, rejections by reason (the poisoning bound's among
them), updates the bound clipped, the norm of each step the
model takes, how long applying and committing take, and how far behind the stream it is.
Scalars only (never a copy of the model), and no client or update id as a label. An aggregator
decides for one run, and its /metrics labels every figure with it (`run`: `exposed`).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Sequence

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from fedasync.services.runtime.prometheus import FoldingRegistry, run_registry
from fedasync.shared.continuity import Check
from fedasync.shared.decision import Decision, Outcome

_TAU_BUCKETS = (0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100, 200, 500, 1000)
_ALPHA_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
_NORM_BUCKETS = (0.001, 0.01, 0.1, 0.3, 1, 3, 10, 30, 100, 1000)
_SECONDS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)


class AggregatorMetrics:
    """One registry per aggregator (tests may run several in one process).

    `registry` counts, without a run label (what tests read); `exposed` is what /metrics
    answers: every sample labelled `run=<run>` (unlabelled for run None)."""

    def __init__(self, run: str | None = None) -> None:
        self.registry = r = FoldingRegistry()
        r.folds.append(self.fold)
        self.exposed = run_registry(r, run)
        #: decisions observed and not yet folded into the metrics (`observe`, `fold`)
        self._decided: list[tuple[Decision, float]] = []
        #: `observe` may run in the deciding thread while a scrape folds on the event loop
        self._lock = threading.Lock()
        self.decisions = Counter(
            "fedasync_aggregator_decisions", "Decisions by outcome", ["outcome"], registry=r
        )
        self.rejections = Counter(
            "fedasync_aggregator_rejections",
            "Invalid updates and undecodable messages, by reason",
            ["reason"],
            registry=r,
        )
        self.authenticated = Counter(
            "fedasync_aggregator_authenticated",
            "Updates whose device signature was verified",
            registry=r,
        )
        self.clipped = Counter(
            "fedasync_aggregator_clipped",
            "Updates applied after the poisoning bound scaled them down",
            registry=r,
        )
        self.drops = Counter(
            "fedasync_aggregator_drops", "Valid updates not used, by reason", ["reason"], registry=r
        )
        self.tau = Histogram(
            "fedasync_aggregator_staleness",
            "Staleness τ of decided updates (versions)",
            buckets=_TAU_BUCKETS,
            registry=r,
        )
        self.alpha = Histogram(
            "fedasync_aggregator_alpha",
            "Effective mixing weight α of applied updates",
            buckets=_ALPHA_BUCKETS,
            registry=r,
        )
        self.step_norm = Histogram(
            "fedasync_aggregator_step_norm",
            "L2 norm of each step the model takes",
            buckets=_NORM_BUCKETS,
            registry=r,
        )
        self.apply_seconds = Histogram(
            "fedasync_aggregator_apply_seconds",
            "Time to decode and decide one update",
            buckets=_SECONDS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "fedasync_aggregator_commit_seconds",
            "Time of one atomic group commit",
            buckets=_SECONDS,
            registry=r,
        )
        self.commits = Counter("fedasync_aggregator_commits", "Group commits made", registry=r)
        self.claimed = Counter(
            "fedasync_aggregator_claimed",
            "Entries taken over after they sat idle under a consumer (another aggregator's)",
            registry=r,
        )
        self.version = Gauge(
            "fedasync_aggregator_model_version", "Latest committed model version", registry=r
        )
        self.policy_version = Gauge(
            "fedasync_aggregator_policy_version", "Version of the policy in force", registry=r
        )
        self.stream_length = Gauge(
            "fedasync_aggregator_stream_length", "Entries in the updates stream", registry=r
        )
        self.pending = Gauge(
            "fedasync_aggregator_pending",
            "Entries delivered to the aggregator and not yet committed",
            registry=r,
        )
        self.lag = Gauge(
            "fedasync_aggregator_lag", "Entries in the stream not yet read", registry=r
        )
        self.redis_oom = Counter(
            "fedasync_aggregator_redis_oom_refusals",
            "Writes (commits, start-up) Redis refused for want of memory; each is retried",
            registry=r,
        )
        # (no "client" in a name or help: the exposition is checked to name none)
        self.remembered = Gauge(
            "fedasync_aggregator_remembered_devices",
            "Devices in the server's book (memory, tiered and fedbuff-fair modes), at most the "
            "policy's bound",
            registry=r,
        )
        self.memory_bytes = Gauge(
            "fedasync_aggregator_memory_bytes",
            "Bytes of remembered deltas in the memory mode: devices with a delta × parameters × 4",
            registry=r,
        )

        # differential privacy: ε spent so far, as the last decision recorded it (its
        # `epsilon_*` fields); no series while DP is off
        self.epsilon = Gauge(
            "fedasync_privacy_epsilon",
            "Privacy spent so far: epsilon at the policy's delta, by accounting model "
            "(sampled: Poisson-sampled steps with amplification; conservative: none)",
            ["model"],
            registry=r,
        )

        self.state_mismatches = Counter(
            "fedasync_aggregator_state_mismatches",
            "Ways the state in Redis contradicted its ledger, consumer group or the last commit "
            "(Redis lost writes), by check; the aggregator refused to decide from it",
            ["check"],
            registry=r,
        )
        for check in Check:  # every series from 0, so a rule can watch for any increase
            self.state_mismatches.labels(check.value)

    def spent(self, sampled: float | None, conservative: float | None) -> None:
        """ε after the newest decision (or, at start, of the restored state)."""
        for model, value in (("sampled", sampled), ("conservative", conservative)):
            if value is not None:
                self.epsilon.labels(model).set(value)

    def observe(self, decision: Decision, seconds: float) -> None:
        """Note one decision; the metrics take it in at the next `fold`.

        Per decision this is one append: five histogram and counter updates for each update
        cost about a tenth of deciding a 10K-parameter model, on the aggregator's one core. The
        aggregator folds after each commit, and every scrape folds first, so what a scrape
        reads is never behind the decisions made."""
        with self._lock:
            self._decided.append((decision, seconds))

    def fold(self) -> None:
        """Take the decisions noted since the last fold into the metrics: the same counts and
        buckets one `observe` call per decision would have given, and the same sums up to the
        order of floating-point additions."""
        with self._lock:
            decided, self._decided = self._decided, []
        if not decided:
            return
        outcomes: Tally[str] = Tally()
        rejections: Tally[str] = Tally()
        drops: Tally[str] = Tally()
        taus: list[float] = []
        alphas: list[float] = []
        norms: list[float] = []
        clipped = 0
        for decision, _ in decided:
            outcomes[decision.outcome.value] += 1
            if decision.tau is not None:
                taus.append(max(decision.tau, 0))
            if decision.outcome is Outcome.APPLIED:
                if decision.alpha is not None:
                    alphas.append(decision.alpha)
                if decision.server_step and decision.step_norm is not None:
                    norms.append(decision.step_norm)
                clipped += bool(decision.clipped)
            elif decision.outcome is Outcome.REJECTED:
                rejections[decision.reason or "unknown"] += 1
            elif decision.outcome is Outcome.DROPPED:
                drops[decision.reason or "unknown"] += 1
        for outcome, n in outcomes.items():
            self.decisions.labels(outcome).inc(n)
        for reason, n in rejections.items():
            self.rejections.labels(reason).inc(n)
        for reason, n in drops.items():
            self.drops.labels(reason).inc(n)
        if clipped:
            self.clipped.inc(clipped)
        observe_all(self.apply_seconds, [seconds for _, seconds in decided])
        observe_all(self.tau, taus)
        observe_all(self.alpha, alphas)
        observe_all(self.step_norm, norms)
        newest = decided[-1][0]
        self.spent(newest.epsilon_sampled, newest.epsilon_conservative)


def observe_all(histogram: Histogram, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for every v, in one pass: each bucket and the sum are added to
    once. Uses the histogram's own bounds and values (prometheus-client keeps per-bucket, not
    cumulative, counts: the bucket of v is the first bound ≥ v, as in `observe`)."""
    if not values:
        return
    amounts = np.asarray(values, dtype=np.float64)
    bounds = np.asarray(histogram._upper_bounds, dtype=np.float64)
    # NaN is ≤ no bound: `observe` counts it in no bucket (only in the sum), and so does this
    counts = np.bincount(np.searchsorted(bounds, amounts, side="left"), minlength=len(bounds) + 1)
    for bucket, n in zip(histogram._buckets, counts[: len(bounds)].tolist(), strict=True):
        if n:
            bucket.inc(n)
    histogram._sum.inc(sum(values))
