"""Decisions noted and folded give the metrics one `observe` call per decision gives.

The aggregator notes each decision with one append and folds them into its Prometheus metrics
after each commit and before each scrape (services/aggregator/metrics.py); the exposition must be
the one per-decision observation gives: same series, same counts and buckets, sums equal up to
the order of floating-point additions.
"""

from __future__ import annotations

import math
import random

from prometheus_client import Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from fedasync.services.aggregator.metrics import AggregatorMetrics, observe_all
from fedasync.shared.decision import Decision, Outcome


def decisions(n: int, seed: int) -> list[tuple[Decision, float]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        outcome = rng.choice(list(Outcome))
        tau = rng.choice([None, 0, 1, 3, 7, 40, 2000])
        applied = outcome is Outcome.APPLIED
        decision = Decision(
            outcome,
            f"u{i}",
            f"c{i % 7}",
            0,
            i,
            1,
            tau=tau,
            alpha=rng.choice([0.0005, 0.01, 0.3, 1.0, 5.0]) if applied else None,
            step_norm=rng.choice([0.0, 0.5, 30.0, 1e6]) if applied else None,
            server_step=applied and rng.random() < 0.8,
            reason=None if applied else rng.choice(["stale", "bad_dtype", None]),
            clipped=applied and rng.random() < 0.3,
        )
        out.append((decision, rng.choice([0.00005, 0.0003, 0.002, 0.7, 9.0])))
    return out


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def one_by_one(metrics: AggregatorMetrics, decided: list[tuple[Decision, float]]) -> None:
    """What `observe` did per decision before decisions were folded."""
    for decision, seconds in decided:
        metrics.decisions.labels(decision.outcome.value).inc()
        metrics.apply_seconds.observe(seconds)
        if decision.tau is not None:
            metrics.tau.observe(max(decision.tau, 0))
        if decision.outcome is Outcome.APPLIED:
            if decision.alpha is not None:
                metrics.alpha.observe(decision.alpha)
            if decision.server_step and decision.step_norm is not None:
                metrics.step_norm.observe(decision.step_norm)
            if decision.clipped:
                metrics.clipped.inc()
        elif decision.outcome is Outcome.REJECTED:
            metrics.rejections.labels(decision.reason or "unknown").inc()
        elif decision.outcome is Outcome.DROPPED:
            metrics.drops.labels(decision.reason or "unknown").inc()


def assert_same(folded: AggregatorMetrics, observed: AggregatorMetrics) -> None:
    mine, theirs = samples(folded.registry), samples(observed.registry)
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        if key[0].endswith("_sum"):
            assert math.isclose(mine[key], value, rel_tol=1e-12), key
        else:
            assert mine[key] == value, key


def test_a_scrape_folds_what_was_noted_and_reads_what_one_observe_each_gives() -> None:
    decided = decisions(500, seed=1)
    folded, observed = AggregatorMetrics(), AggregatorMetrics()
    for decision, seconds in decided[:300]:
        folded.observe(decision, seconds)
    folded.fold()  # a commit folds; the rest waits for the scrape
    for decision, seconds in decided[300:]:
        folded.observe(decision, seconds)
    one_by_one(observed, decided)
    assert_same(folded, observed)  # generate_latest collects, and collecting folds first


def test_a_fold_with_nothing_noted_changes_nothing() -> None:
    metrics = AggregatorMetrics()
    before = samples(metrics.registry)
    metrics.fold()
    assert samples(metrics.registry) == before


def test_observe_all_puts_each_value_in_the_bucket_observe_does_bounds_nan_and_inf_included() -> (
    None
):
    bounds = (0.0, 0.5, 1.0, 10.0)
    values = [-1.0, 0.0, 0.25, 0.5, 0.5000001, 1.0, 9.99, 10.0, 11.0, math.inf, math.nan]
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", buckets=bounds, registry=one)
    h2 = Histogram("h", "h", buckets=bounds, registry=many)
    for value in values:
        h1.observe(value)
    observe_all(h2, values)
    a, b = samples(one), samples(many)
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert (math.isnan(value) and math.isnan(b[key])) or b[key] == value, key
