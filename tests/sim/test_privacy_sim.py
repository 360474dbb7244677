"""Differential privacy in the simulator: the same core decides, bit for bit as a replay of
its updates through AggregationState with the run's secret; the privacy budget ends the run;
the summary reports ε under both models (RDP and PLD) and its curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Decision
from fedasync.shared.seeds import simulated_dp_secret
from fedasync.shared.update import Update
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary
from fedasync.sim.world import build_world
from tests.sim.helpers import config

FLEET = {"devices": 8, "latency": {"kind": "longtail"}, "dropout": 0.15}
DP = {"dp_clip": 0.5, "dp_noise": 1.0, "dp_population": 8, "dp_participation": 12}


@pytest.mark.parametrize(
    "algorithm",
    [
        {"kind": "fedasync", "tau_max": 6, **DP},
        {"kind": "fedbuff", "buffer_size": 3, "tau_max": 6, **DP},
        {
            "kind": "fedbuff-fair",
            "buffer_size": 4,
            "tau_max": 6,
            **DP,
            "dp_quantile": 0.5,
            "dp_count_noise": 1.0,
            "dp_noise": 0.8,
        },
    ],
    ids=["dp-fedasync", "dp-fedbuff", "dp-fedbuff-fair-adaptive"],
)
def test_a_replay_of_a_dp_simulation_reproduces_every_decision_bit_for_bit(
    algorithm: dict[str, Any],
) -> None:
    cfg = config(fleet=FLEET, algorithms=[algorithm], budget={"max_updates": 90})
    world = build_world(cfg)
    submitted: list[tuple[Update, Decision]] = []
    sim = simulate(cfg, world=world, on_decision=lambda u, d: submitted.append((u, d)))
    result = sim.results[0]
    assert any(d.clipped for _, d in submitted)  # the clip was exercised
    assert all(d.epsilon_conservative is not None for _, d in submitted)
    assert any(d.reason == "participation_cap" for _, d in submitted)

    replay = AggregationState(
        world.init_weights.copy(), world.task.layout, dp_secret=simulated_dp_secret(cfg.seed)
    )
    policy = cfg.algorithms[0].policy(result.settings["tau_max"])  # type: ignore[union-attr]
    assert policy.to_dict() == result.settings
    for update, decision in submitted:
        assert replay.apply(update, policy).to_dict() == decision.to_dict()
    assert replay.weights_view().tobytes() == result.weights.tobytes()
    assert replay.counters == result.counters
    # another secret draws other noise: the weights depend on it
    other = AggregationState(world.init_weights.copy(), world.task.layout, dp_secret=b"x" * 32)
    for update, _ in submitted:
        other.apply(update, policy)
    assert other.weights_view().tobytes() != result.weights.tobytes()


def test_the_privacy_budget_ends_the_simulation_and_the_summary_reports_epsilon() -> None:
    algorithm = {"kind": "fedasync", "tau_max": 6, **DP, "privacy_budget": 20.0}
    algorithm.pop("dp_participation")
    cfg = config(fleet=FLEET, algorithms=[algorithm], budget={"max_updates": 1000})
    summary = build_summary(simulate(cfg))
    (run,) = (
        summary["algorithms"].values()
        if isinstance(summary["algorithms"], dict)
        else summary["algorithms"]
    )
    assert run["ended_by"] == "privacy_budget"
    privacy = run["privacy"]
    assert privacy["epsilon_conservative"] <= 20.0
    assert privacy["pld_epsilon_conservative"] <= privacy["epsilon_conservative"]
    assert privacy["epsilon_sampled"] < privacy["epsilon_conservative"]  # amplified
    curve = [p["epsilon_conservative"] for p in run["epsilon"]]
    assert curve == sorted(curve)
    assert len(curve) > 1


def test_a_simulation_without_dp_has_no_privacy_in_its_summary() -> None:
    summary = build_summary(simulate(config(budget={"max_updates": 20})))
    for run in summary["algorithms"].values():
        assert "privacy" not in run
        assert "epsilon" not in run


def test_dp_fedavg_clips_and_noises_each_round_and_its_budget_ends_the_run() -> None:
    """The synchronous baseline with DP: the core's clip and noise (shared/fedavg.py,
    `dp_fedavg`), accounted by the core's PrivacySpent, ended by its privacy budget."""
    algorithms = [
        {"kind": "fedavg", "clients_per_round": 4, "dp_clip": 0.5, "dp_noise": 1.0},
        {
            "kind": "fedavg",
            "name": "budgeted",
            "clients_per_round": 4,
            "dp_clip": 0.5,
            "dp_noise": 1.0,
            "privacy_budget": 15.0,
        },
    ]
    cfg = config(fleet=FLEET, algorithms=algorithms, budget={"max_updates": 400})
    free, budgeted = simulate(cfg).results
    assert free.privacy is not None
    assert free.privacy["noised_steps"] == free.counters["rounds"]
    assert budgeted.ended_by == "privacy_budget"
    assert budgeted.privacy is not None
    assert budgeted.privacy["epsilon_conservative"] <= 15.0
    assert budgeted.counters["rounds"] < free.counters["rounds"]
    assert budgeted.recorder.epsilon


def test_a_dp_simulation_draws_its_privacy_chart(tmp_path: Path) -> None:
    from fedasync.sim.plots import write_plots

    algorithm = {"kind": "fedbuff", "buffer_size": 3, "tau_max": 6, **DP}
    sim = simulate(config(fleet=FLEET, algorithms=[algorithm], budget={"max_updates": 40}))
    images = write_plots(sim, tmp_path)
    assert images[-1] == "privacy.png"
    assert (tmp_path / "privacy.png").stat().st_size > 0
