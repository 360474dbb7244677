"""The τ_max advisor's arithmetic: τ ≈ rate × P95 latency, backed off, and who it cuts off."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedasync.shared.fleet import (
    LONG_TAIL,
    DeviceLatency,
    FixedFleet,
    LogNormalFleet,
    ReplayedLatency,
    RunLatency,
)
from fedasync.shared.params import TAU_MAX_LIMIT
from fedasync.sim.advisor import Laws, advise, estimated_rate, fleet_quantile
from fedasync.sim.config import build
from fedasync.sim.presets import PRESETS
from fedasync.sim.runner import fleet_advice
from fedasync.sim.world import build_world
from tests.sim.helpers import config, preset_for_tests

# 20 devices: 19 take 10 s, one takes 100 s, no jitter
FLEET = [DeviceLatency(10.0)] * 19 + [DeviceLatency(100.0)]


def test_write_up_example_p95_three_minutes_at_half_an_update_per_second() -> None:
    # section 4.2: P95 = 180 s, 0.5 updates/s ⇒ τ of the slowest ≈ 90
    fleet = [DeviceLatency(20.0)] * 95 + [DeviceLatency(180.0)] * 5
    advice = advise(fleet, rate_per_s=0.5, tau_max=10)
    assert fleet_quantile(fleet, 0.95) == pytest.approx(20.0)  # exactly 95% take 20 s
    at_96 = advise(fleet, rate_per_s=0.5, quantile=0.96)
    assert at_96.expected_tau_slowest == pytest.approx(90.0)
    assert at_96.recommended_tau_max == 67  # 90 backed off 25%
    assert at_96.recommended_range == (62, 72)  # 30% .. 20%
    # τ_max = 10: runs over 20 s are dropped, so the five 3-minute devices never get through
    assert advice.cutoff_s == pytest.approx(20.0)
    assert advice.permanently_dropped == (95, 96, 97, 98, 99)
    assert advice.permanently_dropped_share == pytest.approx(0.05)


def test_expected_tau_and_dropped_update_share() -> None:
    advice = advise(FLEET, rate_per_s=2.0, tau_max=100, quantile=0.99)
    assert advice.slow_latency_s == pytest.approx(100.0)
    assert advice.expected_tau_slowest == pytest.approx(200.0)
    assert advice.recommended_tau_max == 150
    assert advice.permanently_dropped == (19,)  # 100 s × 2/s = 200 > 100
    # the slow device sends 1/10 as often as each fast one: 0.01 / (19·0.1 + 0.01)
    assert advice.dropped_update_share == pytest.approx(0.01 / 1.91)
    assert advise(FLEET, rate_per_s=2.0, tau_max=200).permanently_dropped == ()


def test_recommendation_never_exceeds_the_core_limit() -> None:
    assert advise(FLEET, rate_per_s=1000.0, quantile=0.99).recommended_tau_max == TAU_MAX_LIMIT


def test_estimated_rate_sums_inverse_latencies_and_respects_a_cap() -> None:
    assert estimated_rate(FLEET) == pytest.approx(19 / 10 + 1 / 100)
    assert estimated_rate(FLEET, max_concurrency=2) == pytest.approx(2 / ((19 * 10 + 100) / 20))
    assert estimated_rate(FLEET, online_share=0.5) == pytest.approx((1.9 + 0.01) / 2)


def test_jittered_and_replayed_latencies_have_consistent_quantiles() -> None:
    jittered = DeviceLatency(30.0, jitter=0.2)
    assert jittered.cdf(jittered.quantile(0.95)) == pytest.approx(0.95)
    assert jittered.quantile(0.5) == pytest.approx(30.0)
    replayed = ReplayedLatency((5.0, 1.0, 3.0, 2.0, 4.0))
    assert replayed.quantile(0.6) == 3.0
    assert replayed.cdf(3.0) == pytest.approx(0.6)
    assert replayed.mean() == 3.0
    assert [replayed.sample(np.random.default_rng(0)) for _ in range(6)] == [5, 1, 3, 2, 4, 5]


def test_long_tail_fleet_advice_matches_the_write_up_mixture() -> None:
    devices = LONG_TAIL.devices(100, np.random.default_rng(0))
    medians = sorted(d.median_s for d in devices)
    assert medians.count(30.0) == 70
    assert medians.count(90.0) == 20
    assert medians.count(180.0) == 8
    assert medians.count(600.0) == 2
    cfg = config(fleet={"devices": 100, "latency": {"kind": "longtail", "jitter": 0.2}})
    advice = fleet_advice(build_world(cfg))
    expected_rate = sum(1 / d.mean() for d in devices)
    assert advice.rate_per_s == pytest.approx(expected_rate)
    assert 150 < advice.slow_latency_s < 230  # P95 sits in the 3-minute tier
    assert advice.expected_tau_slowest == pytest.approx(expected_rate * advice.slow_latency_s)


# ----------------------------------------------------------------- grouped laws (issue 16)
def plain_advice(latencies: list[RunLatency], rate: float, tau_max: int | None) -> dict[str, Any]:
    """The advisor as it was before grouping: one CDF per device per bisection step."""
    low = min(lat.quantile(1e-6) for lat in latencies)
    high = max(lat.quantile(1 - 1e-6) for lat in latencies)
    for _ in range(200):
        mid = (low + high) / 2
        if sum(lat.cdf(mid) for lat in latencies) / len(latencies) >= 0.95:
            high = mid
        else:
            low = mid
    expected = rate * high
    recommended = min(TAU_MAX_LIMIT, max(0, math.floor(expected * 0.75)))
    cutoff = (recommended if tau_max is None else tau_max) / rate
    too_slow = [1.0 - lat.cdf(cutoff) for lat in latencies]
    weights = [1.0 / lat.mean() for lat in latencies]
    return {
        "slow_latency_s": high,
        "recommended_tau_max": recommended,
        "cutoff_s": cutoff,
        "permanently_dropped": [d for d, s in enumerate(too_slow) if s >= 0.95],
        "dropped_update_share": sum(w * s for w, s in zip(weights, too_slow, strict=True))
        / sum(weights),
        "rate": sum(1.0 / lat.mean() for lat in latencies),
    }


FLEETS = {
    "longtail": lambda rng: LONG_TAIL.devices(5000, rng),
    "lognormal": lambda rng: LogNormalFleet(60.0, 0.8, 0.2).devices(300, rng),
    "fixed": lambda rng: FixedFleet((10.0, 10.0, 25.0, 400.0), 0.0).devices(999, rng),
    "replayed": lambda rng: [ReplayedLatency((5.0, 9.0)), ReplayedLatency((5.0, 9.0))] * 40,
}


@pytest.mark.parametrize("kind", sorted(FLEETS))
@pytest.mark.parametrize("tau_max", [None, 7])
def test_grouped_laws_advise_bit_for_bit_as_one_cdf_per_device(
    kind: str, tau_max: int | None
) -> None:
    latencies = list(FLEETS[kind](np.random.default_rng(3)))
    plain = plain_advice(latencies, 0.37, tau_max)
    laws = Laws(latencies)
    advice = advise(laws, 0.37, tau_max).to_dict()
    assert estimated_rate(laws) == plain.pop("rate")
    assert {key: advice[key] for key in plain} == plain
    if kind in ("longtail", "fixed"):  # a handful of distinct laws, however many devices
        assert len(laws.distinct) <= 4


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_gets_the_advice_of_one_cdf_per_device(preset: str) -> None:
    world = build_world(build(preset_for_tests(preset)))
    latencies = world.new_fleet().latencies
    advice = fleet_advice(world)
    plain = plain_advice(latencies, advice.rate_per_s, None)
    plain.pop("rate")
    assert {key: advice.to_dict()[key] for key in plain} == plain
