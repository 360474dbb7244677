"""The supervisor's metrics: its children per run and role, restarts, and runs by status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    from fedasync.services.supervisor.children import Children


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.running = Gauge(
            "fedasync_supervisor_child_running",
            "1 while the child of this run and role runs, 0 while it is down",
            ["run", "role"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "fedasync_supervisor_restarts",
            "children restarted after they died, by run and role",
            ["run", "role"],
            registry=self.registry,
        )
        self.runs = Gauge(
            "fedasync_supervisor_runs",
            "runs in the directory by status (created, training, paused, done, unmanaged)",
            ["status"],
            registry=self.registry,
        )

    def restarted(self, run: str, role: str) -> None:
        self.restarts.labels(run, role).inc()

    def observe(self, status: dict[str, str], children: Children) -> None:
        counts: dict[str, int] = {}
        for value in status.values():
            counts[value] = counts.get(value, 0) + 1
        for value in ("created", "training", "paused", "done", "unmanaged"):
            self.runs.labels(value).set(counts.get(value, 0))
        self.running.clear()
        for name, kept in children.kept.items():
            child = children.child(name)
            self.running.labels(kept.run, kept.role).set(int(child is not None and child.running()))
