"""Prometheus metrics of the evaluator (own registry: several may live in one test process).

An evaluator follows one run, and its /metrics labels every figure with it (`run`: `exposed`);
the figures are counted (and read by tests) in `registry`, without the label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fedasync.learning.evaluation import Evaluation
from fedasync.services.runtime.prometheus import run_registry

#: why the follow loop did not score a version
FAILURE_REASONS = ("fetch", "redis", "decode", "weights", "error")


class EvaluatorMetrics:
    def __init__(self, run: str | None = None) -> None:
        self.registry = CollectorRegistry()
        #: what /metrics answers: every sample labelled `run=<run>` (unlabelled for None)
        self.exposed = run_registry(self.registry, run)
        self.evaluations = Counter(
            "fedasync_evaluator_evaluations", "Versions evaluated", registry=self.registry
        )
        self.skipped = Counter(
            "fedasync_evaluator_skipped_versions",
            "Committed versions never evaluated because a newer one was already there",
            registry=self.registry,
        )
        self.failures = Counter(
            "fedasync_evaluator_failures",
            "Failures of the follow loop, by reason: fetch (snapshot service), redis, decode "
            "(a model message that does not decode), weights (not this task's model), "
            "error (a bug)",
            ["reason"],
            registry=self.registry,
        )
        for reason in FAILURE_REASONS:  # every series from 0, so `increase()` sees the first one
            self.failures.labels(reason)
        self.version = Gauge(
            "fedasync_evaluator_version", "Model version last evaluated", registry=self.registry
        )
        self.accuracy = Gauge(
            "fedasync_evaluator_accuracy",
            "Test accuracy (classification) or R² (regression) of the version last evaluated",
            registry=self.registry,
        )
        self.loss = Gauge(
            "fedasync_evaluator_loss",
            "Test loss of the version last evaluated",
            registry=self.registry,
        )
        self.class_accuracy = Gauge(
            "fedasync_evaluator_class_accuracy",
            "Test accuracy of the version last evaluated, per class",
            ["class"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "fedasync_evaluator_duration_seconds",
            "Time to evaluate one version",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60),
            registry=self.registry,
        )

    def record(self, version: int, evaluation: Evaluation, seconds: float) -> None:
        self.evaluations.inc()
        self.version.set(version)
        self.accuracy.set(evaluation.score)
        self.loss.set(evaluation.loss)
        for label, value in evaluation.per_class.items():
            self.class_accuracy.labels(str(label)).set(value)
        self.duration.observe(seconds)
