"""Latency profiles, availability (shared/fleet.py) and the FedAvg mean (shared/fedavg.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedasync.shared import fleet
from fedasync.shared.fedavg import fedavg


def test_mixture_counts_follow_the_shares_exactly() -> None:
    devices = fleet.LONG_TAIL.devices(37, np.random.default_rng(0))
    counts = {m: sum(d.median_s == m for d in devices) for m in (30.0, 90.0, 180.0, 600.0)}
    assert sum(counts.values()) == 37
    assert counts == {30.0: 26, 90.0: 7, 180.0: 3, 600.0: 1}  # 25.9, 7.4, 2.96, 0.74


@pytest.mark.parametrize(
    "profile",
    [fleet.LogNormalFleet(), fleet.ParetoFleet(), fleet.ExponentialFleet(), fleet.LONG_TAIL],
)
def test_profiles_are_seeded_and_positive(profile: fleet.Mixture) -> None:
    a = profile.devices(50, np.random.default_rng(1))
    b = profile.devices(50, np.random.default_rng(1))
    assert a == b
    assert all(d.median_s > 0 for d in a)
    draws = [a[0].sample(np.random.default_rng(2)) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2] > 0


def test_jitter_is_lognormal_around_the_median() -> None:
    latency = fleet.DeviceLatency(30.0, jitter=0.3)
    rng = np.random.default_rng(0)
    draws = np.array([latency.sample(rng) for _ in range(20_000)])
    assert np.median(draws) == pytest.approx(30.0, rel=0.02)
    assert np.mean(draws) == pytest.approx(latency.mean(), rel=0.02)
    assert latency.scaled(0.01).median_s == pytest.approx(0.3)


def test_windows_answer_online_end_and_next() -> None:
    w = fleet.Windows([(0.0, 10.0), (20.0, 30.0)])
    assert w.online_at(0.0)
    assert w.online_at(9.99)
    assert not w.online_at(10.0)
    assert w.window_end(5.0) == 10.0
    assert w.next_online(12.0) == 20.0
    assert w.next_online(25.0) == 25.0
    assert w.next_online(30.0) is None


def test_intermittent_schedule_is_a_fixed_function_of_its_stream() -> None:
    a = fleet.Intermittent(50.0, 50.0, np.random.default_rng(3))
    b = fleet.Intermittent(50.0, 50.0, np.random.default_rng(3))
    times = np.linspace(0, 5000, 2001)
    seen_a = [a.online_at(t) for t in times]
    seen_b = [b.online_at(t) for t in reversed(times)][::-1]  # asked in another order
    assert seen_a == seen_b
    assert 0.35 < np.mean(seen_a) < 0.65
    t = next(t for t, on in zip(times, seen_a, strict=True) if not on)
    back = a.next_online(t)
    assert back is not None
    assert back > t
    assert a.online_at(back)


def test_fedavg_is_the_sample_weighted_mean() -> None:
    models = [np.array([1.0, 0.0], np.float32), np.array([4.0, 3.0], np.float32)]
    assert fedavg(models, [1, 2]).tolist() == [3.0, 2.0]
    assert fedavg(models, [5, 5]).dtype == np.float32
    assert models[0].tolist() == [1.0, 0.0]  # inputs only read
    with pytest.raises(ValueError, match=">= 1"):
        fedavg(models, [0, 1])
    with pytest.raises(ValueError, match="shape"):
        fedavg([models[0], np.zeros(3, np.float32)], [1, 1])
    with pytest.raises(ValueError, match="at least one"):
        fedavg([], [])
    assert math.isclose(
        float(fedavg([np.full(3, 0.1, np.float32)] * 7, [3] * 7)[0]), 0.1, rel_tol=1e-6
    )
