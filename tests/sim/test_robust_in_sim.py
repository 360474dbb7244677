"""Robust rules in the simulator: the algorithm tables take the policy's robust fields, refuse
what the core refuses with the key named, and decide through the same core as the aggregator."""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Decision
from fedasync.shared.update import Update
from fedasync.sim.config import ConfigError
from fedasync.sim.runner import simulate
from fedasync.sim.world import build_world
from tests.sim.helpers import config

FLEET = {"devices": 8, "latency": {"kind": "longtail"}, "dropout": 0.15}


@pytest.mark.parametrize(
    "algorithm",
    [
        {"kind": "fedbuff", "buffer_size": 5, "robust": "multi_krum", "robust_byzantine": 1},
        {"kind": "fedbuff-fair", "buffer_size": 4, "robust": "trimmed_mean", "robust_trim": 0.25},
    ],
    ids=["fedbuff-multi-krum", "fedbuff-fair-trimmed"],
)
def test_a_robust_simulation_decides_as_a_replay_through_the_core(
    algorithm: dict[str, Any],
) -> None:
    cfg = config(fleet=FLEET, algorithms=[algorithm], budget={"max_updates": 60})
    world = build_world(cfg)
    submitted: list[tuple[Update, Decision]] = []
    sim = simulate(cfg, world=world, on_decision=lambda u, d: submitted.append((u, d)))
    result = sim.results[0]
    assert result.settings["robust"] == algorithm["robust"]
    steps = [d for _, d in submitted if d.server_step]
    assert steps
    assert all(d.detail.startswith(algorithm["robust"]) for d in steps)
    replay = AggregationState(world.init_weights.copy(), world.task.layout)
    policy = cfg.algorithms[0].policy(result.settings["tau_max"])  # type: ignore[union-attr]
    for update, decision in submitted:
        assert replay.apply(update, policy).to_dict() == decision.to_dict()
    if algorithm["robust"] == "multi_krum":  # K = 5, f = 1: each step leaves one out
        assert all(len(d.excluded) == 1 for d in steps)


@pytest.mark.parametrize(
    ("algorithm", "why"),
    [
        ({"kind": "fedasync", "robust": "median"}, "robust = 'median'"),
        ({"kind": "fedbuff", "buffer_size": 4, "robust": "krum"}, "robust_byzantine = 1"),
        ({"kind": "fedbuff", "robust": "average"}, "robust"),
    ],
)
def test_a_robust_setting_the_core_refuses_is_a_config_error_naming_it(
    algorithm: dict[str, Any], why: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config(algorithms=[algorithm])
    assert "algorithms.0" in str(caught.value)
    assert why in str(caught.value)
