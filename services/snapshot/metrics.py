"""The snapshot service's Prometheus metrics, apart from its app and its fast path.

Both count into them: the app's handlers (app.py) directly, the fast path (fast.py) in plain ints
that it folds in whenever they are read. Here, neither of the two imports the other for them.

The service serves many runs: each run's figures (requests, bytes, versions, its follower) are
kept in a registry of that run's own (RunMetrics) and exposed with the label `run=<id>`; the
process's own figures (which worker answered, how many runs it holds, runs refused) carry no
run label.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.registry import Collector

from fedasync.services.runtime.prometheus import FoldingRegistry, Merged, RunLabelled
from fedasync.shared.runs import DEFAULT_RUN


class RunMetrics:
    """One run's figures, in a registry of its own (unlabelled: SnapshotMetrics adds `run`)."""

    def __init__(self) -> None:
        self.registry = FoldingRegistry()
        self.requests = Counter(
            "fedasync_snapshot_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.sent = Counter(
            "fedasync_snapshot_sent_bytes", "Model bytes sent", registry=self.registry
        )
        self.not_modified = Counter(
            "fedasync_snapshot_not_modified",
            "Requests answered 304 Not Modified",
            registry=self.registry,
        )
        self.waiters = Gauge(
            "fedasync_snapshot_long_poll_waiters",
            "Long-polls waiting for a newer version",
            registry=self.registry,
        )
        self.version = Gauge(
            "fedasync_snapshot_model_version",
            "Newest model version held in memory",
            registry=self.registry,
        )
        self.regressed = Gauge(
            "fedasync_snapshot_version_regressed",
            "1 once Redis reported a version below the newest one served (Redis lost commits): "
            "the service then follows no more versions of that run until it is restarted",
            registry=self.registry,
        )
        self.follow_failures = Counter(
            "fedasync_snapshot_follow_failures",
            "Failures of the version follower, each retried after a backoff, by kind: "
            "connection (Redis unreachable or timed out), redis (an error reply such as NOPERM), "
            "error (anything else, e.g. a stored model that does not decode)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("connection", "redis", "error"):
            self.follow_failures.labels(kind)


class SnapshotMetrics:
    """Prometheus metrics of one app (own registry: several apps may live in one test process):
    the process's figures, and each run's (`run`), the default run's from the start."""

    def __init__(self, default_run: str = DEFAULT_RUN) -> None:
        self.registry = FoldingRegistry()
        self._runs: dict[str, RunMetrics] = {}
        self.registry.register(Merged(self._labelled))
        self.worker = Gauge(
            "fedasync_snapshot_worker",
            "1, labelled with which of the processes sharing the port (FEDASYNC_SNAPSHOT__WORKERS) "
            "answered: every figure on this page is that worker's alone",
            ["worker"],
            registry=self.registry,
        )
        self.runs = Gauge(
            "fedasync_snapshot_runs",
            "Runs whose models this worker holds in memory and follows (at most "
            "FEDASYNC_SNAPSHOT__MAX_RUNS)",
            registry=self.registry,
        )
        self.runs.set_function(lambda: len(self._runs))
        self.runs_refused = Counter(
            "fedasync_snapshot_runs_refused",
            "Requests for a run refused (503 too_many_runs) because this worker already holds "
            "FEDASYNC_SNAPSHOT__MAX_RUNS runs",
            registry=self.registry,
        )
        #: the default run's figures (the legacy routes')
        self.default = self.run(default_run)

    def run(self, run: str) -> RunMetrics:
        """`run`'s figures, made on first use."""
        metrics = self._runs.get(run)
        if metrics is None:
            metrics = self._runs[run] = RunMetrics()
        return metrics

    def _labelled(self) -> Iterator[Collector]:
        for run, metrics in list(self._runs.items()):
            yield RunLabelled(metrics.registry, run)
