"""shared/stats.py: the statistics the simulator, `fedasync up` and the control service share."""

from __future__ import annotations

import pytest

from fedasync.shared.stats import AppliedRate, percentiles, stats


def test_stats_and_percentiles_of_values_and_of_nothing() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats(values) == {
        "count": 100,
        "mean": 50.5,
        "p50": pytest.approx(50.5),
        "p95": pytest.approx(95.05),
        "max": 100.0,
    }
    assert percentiles(values) == {"p50": 50.5, "p95": pytest.approx(95.05), "max": 100.0}
    assert stats([]) == {"count": 0, "mean": None, "p50": None, "p95": None, "max": None}
    assert percentiles([]) is None


def test_applied_rate_runs_from_the_first_applied_update_to_the_last() -> None:
    rate = AppliedRate()
    for at, outcome in [
        (0.0, "dropped"),  # before the first applied update: start-up, not counted
        (30.0, "applied"),
        (31.0, "duplicate"),
        (32.0, "applied"),
        (34.0, "applied"),
        (90.0, "dropped"),  # after the last one: not counted either
    ]:
        rate.add(at, outcome)
    assert rate.per_second == pytest.approx(2 / 4)  # two intervals over 4 s
    assert (rate.applied, rate.first_at, rate.last_at) == (3, 30.0, 34.0)


def test_applied_rate_needs_two_applied_updates_apart() -> None:
    rate = AppliedRate()
    assert rate.per_second is None
    rate.add(5.0, "applied")
    assert rate.per_second is None
    rate.add(5.0, "applied")  # one commit: the same instant
    assert rate.per_second is None
