"""The control service's update-rate rule on virtual time: the same rule and switch objects."""

from __future__ import annotations

import pytest

from fedasync.shared.decision import Decision
from fedasync.shared.update import Update
from fedasync.sim.config import ConfigError
from fedasync.sim.runner import simulate
from tests.sim.helpers import config, fixed_fleet


def rule_config(rate_high: float, rate_low: float) -> dict[str, object]:
    return {
        "kind": "fedasync",
        "tau_max": 50,
        "rules": {
            "interval_s": 30,  # at every evaluation (tests/sim/helpers.py evaluates every 30 s)
            "rate_high": rate_high,
            "rate_low": rate_low,
            "hold_s": 0,
            "cooldown_s": 0,
            "window_s": 60,
        },
    }


def test_a_rate_above_the_threshold_raises_gamma_for_the_later_decisions() -> None:
    # 6 devices of 10 s each: 0.6 decisions/s, above a threshold of 0.3
    sim_config = config(
        fleet=fixed_fleet([10.0] * 6),
        budget={"max_updates": 80, "max_seconds": 3600},
        algorithms=[rule_config(0.3, 0.1)],
    )
    seen: list[Decision] = []

    def record(update: Update, decision: Decision) -> None:
        seen.append(decision)

    [result] = simulate(sim_config, on_decision=record).results
    [change] = result.policy_changes  # steady rate: on once, never off (no flapping)
    assert (change["switch"], change["on"], change["policy_version"]) == ("raise-gamma", True, 1)
    versions = [d.policy_version for d in seen]
    assert versions[0] == 0
    assert versions[-1] == 1
    assert versions == sorted(versions)  # once switched, every later decision uses it


def test_no_rule_no_policy_change() -> None:
    sim_config = config(fleet=fixed_fleet([10.0] * 6))
    [result] = simulate(sim_config).results
    assert result.policy_changes == ()


def test_rule_levels_are_validated() -> None:
    with pytest.raises(ConfigError, match="rate_low"):
        config(algorithms=[rule_config(0.1, 0.5)])
