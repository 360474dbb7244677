"""Sanity against closed forms, with fixed latencies (no jitter).

Synchronous: a round lasts exactly as long as its slowest kept device. Asynchronous: the update
rate is Σ 1/latency over the devices training at once.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from fedasync.sim.runner import simulate
from tests.sim.helpers import config, fixed_fleet

MEDIANS = [5.0, 7.0, 11.0, 13.0, 17.0, 19.0, 23.0, 29.0]


def test_a_sync_round_lasts_as_long_as_its_slowest_selected_device() -> None:
    cfg = config(
        fleet=fixed_fleet(MEDIANS),
        algorithms=[{"kind": "fedavg", "clients_per_round": 3}],
        budget={"max_updates": 10_000, "max_seconds": 2000},
    )
    result = simulate(cfg).results[0]
    rounds = result.recorder.rounds
    assert len(rounds) > 50
    for previous, current in itertools.pairwise(rounds):
        assert current.start_s == previous.end_s  # the next round starts at once
    for rd in rounds:
        assert len(rd.selected) == 3
        assert rd.kept == rd.selected
        assert rd.end_s - rd.start_s == pytest.approx(max(MEDIANS[d] for d in rd.selected))
    assert result.ended_by == "max_seconds"


def test_with_over_selection_a_round_lasts_until_the_mth_fastest() -> None:
    cfg = config(
        fleet=fixed_fleet(MEDIANS),
        algorithms=[{"kind": "fedavg", "clients_per_round": 2, "over_selection": 1.0}],
        budget={"max_updates": 200, "max_seconds": 5000},
    )
    for rd in simulate(cfg).results[0].recorder.rounds:
        assert len(rd.selected) == 4
        assert len(rd.kept) == 2
        latencies = sorted(MEDIANS[d] for d in rd.selected)
        assert rd.end_s - rd.start_s == pytest.approx(latencies[1])
        assert {MEDIANS[d] for d in rd.kept} == set(latencies[:2])


def test_a_deadline_cuts_the_round_and_keeps_who_made_it() -> None:
    cfg = config(
        fleet=fixed_fleet(MEDIANS),
        algorithms=[{"kind": "fedavg", "clients_per_round": 4, "deadline_s": 12.0}],
        budget={"max_updates": 200, "max_seconds": 5000},
    )
    for rd in simulate(cfg).results[0].recorder.rounds:
        fast = tuple(sorted(d for d in rd.selected if MEDIANS[d] <= 12.0))
        assert rd.kept == fast
        slowest = max(MEDIANS[d] for d in rd.selected)
        assert rd.end_s - rd.start_s == pytest.approx(min(slowest, 12.0))


@pytest.mark.parametrize("horizon", [400.0, 1000.0])
def test_async_update_rate_is_the_sum_of_inverse_latencies(horizon: float) -> None:
    medians = [10.0, 20.0, 40.0]
    cfg = config(
        fleet=fixed_fleet(medians),
        algorithms=[{"kind": "fedasync", "tau_max": 1000}],
        budget={"max_updates": 100_000, "max_seconds": horizon},
    )
    result = simulate(cfg).results[0]
    received = sum(result.recorder.submitted)
    assert received == sum(int(horizon // m) for m in medians)
    rate = Fraction(received) / Fraction(horizon)
    assert rate == sum(Fraction(1) / Fraction(m) for m in (10, 20, 40))  # 0.175 per second


def test_with_a_concurrency_cap_the_rate_counts_only_devices_training_at_once() -> None:
    cfg = config(
        fleet=fixed_fleet([10.0] * 5, max_concurrency=2),
        algorithms=[{"kind": "fedasync", "tau_max": 1000}],
        budget={"max_updates": 100_000, "max_seconds": 100.0},
    )
    result = simulate(cfg).results[0]
    assert sum(result.recorder.submitted) == 2 * 10  # 2 devices at once × 1/10 s × 100 s
    assert all(n >= 3 for n in result.recorder.submitted)  # waiting devices are served in turn
