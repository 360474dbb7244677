"""The snapshot service's Prometheus metrics, apart from its app and its fast path.

Both count into them: the app's handlers (app.py) directly, the fast path (fast.py) in plain ints
that it folds in whenever they are read. Here, neither of the two imports the other for them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from fedasync.services.runtime.prometheus import FoldingRegistry


class SnapshotMetrics:
    """Prometheus metrics of one app (own registry: several apps may live in one test process)."""

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
            "the service then follows no more versions until it is restarted",
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
        self.worker = Gauge(
            "fedasync_snapshot_worker",
            "1, labelled with which of the processes sharing the port (FEDASYNC_SNAPSHOT__WORKERS) "
            "answered: every figure on this page is that worker's alone",
            ["worker"],
            registry=self.registry,
        )
