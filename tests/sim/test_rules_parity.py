"""The rate-spike preset and the lag, drop and fairness rules on virtual time.

The preset is run with the linear task instead of digits: when a switch flips depends only on
when decisions happen (the fleet's timing and the aggregator's service time), never on what the
devices learn, so the times asserted here are the preset's own; the linear task is much faster.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.sim.config import ConfigError, build
from fedasync.sim.presets import preset_data
from fedasync.sim.result import RunResult
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary
from tests.sim.helpers import config, fixed_fleet


def spike_preset(algorithm: str) -> dict[str, Any]:
    data = preset_data("rate-spike")
    data["task"] = {"name": "linear", "params": {"samples": 1200}}
    data["training"] = {"epochs": 1, "batch_size": 64}
    data["algorithms"] = [a for a in data["algorithms"] if a["name"] == algorithm]
    return data


def run_spike(algorithm: str) -> RunResult:
    [result] = simulate(build(spike_preset(algorithm))).results
    return result


def reaction_s(data: dict[str, Any]) -> float:
    """Longest a rule may take to act once its figure has crossed: the window must fill with the
    new rate, the condition must hold, and a rule evaluation must come round."""
    rules = data["algorithms"][0]["rules"]
    return float(rules["window_s"] + rules["hold_s"] + rules["interval_s"])


def test_rate_spike_turns_raise_gamma_on_during_the_spike_and_off_after_it() -> None:
    data = spike_preset("fedasync-rate-rule")
    [phase] = data["fleet"]["phases"]
    start, end = phase["from_s"], phase["until_s"]
    result = run_spike("fedasync-rate-rule")
    on, off = result.policy_changes
    assert (on["switch"], on["on"], off["switch"], off["on"]) == (
        "raise-gamma",
        True,
        "raise-gamma",
        False,
    )
    assert start < on["at_s"] <= start + reaction_s(data)
    # runs started just before the end are still short: the rate falls a latency after the end
    assert end < off["at_s"] <= end + 60 + reaction_s(data)
    assert (on["policy_version"], off["policy_version"]) == (1, 2)
    assert run_spike("fedasync-rate-rule").policy_changes == result.policy_changes  # same times


def test_rate_spike_summary_lists_the_changes_with_virtual_times() -> None:
    sim = simulate(build(spike_preset("fedasync-rate-rule")))
    summary = build_summary(sim)["algorithms"]["fedasync-rate-rule"]
    assert [(c["at_s"], c["switch"], c["on"]) for c in summary["policy_changes"]] == [
        (c["at_s"], c["switch"], c["on"]) for c in sim.results[0].policy_changes
    ]
    assert summary["alerts"] == []  # τ_max = 100 starves nobody: no fairness alert


def test_a_slow_aggregator_lags_in_the_spike_and_the_lag_rule_turns_freshest_only_on() -> None:
    data = spike_preset("fedasync-lag-rule")
    [phase] = data["fleet"]["phases"]
    result = run_spike("fedasync-lag-rule")
    on, off = result.policy_changes
    assert (on["rule"], on["switch"], on["on"], off["on"]) == ("lag", "freshest-only", True, False)
    assert phase["from_s"] < on["at_s"] < phase["until_s"]
    assert off["at_s"] > phase["until_s"]  # only once the backlog has drained
    lag_at = {t: lag for t, _, lag in result.rule_figures}
    assert lag_at[on["at_s"]] > 200
    assert lag_at[off["at_s"]] < 20
    assert max(lag for t, _, lag in result.rule_figures if t < phase["from_s"]) < 20
    drops = [a for a in result.alerts if a["rule"] == "drops"]
    assert drops
    assert all(phase["from_s"] < a["at_s"] <= off["at_s"] for a in drops)


def test_without_a_decision_time_the_lag_is_zero_and_the_lag_rule_never_fires() -> None:
    data = spike_preset("fedasync-lag-rule")
    del data["algorithms"][0]["decide_s"]
    [result] = simulate(build(data)).results
    assert {lag for _, _, lag in result.rule_figures} == {0.0}
    assert result.policy_changes == ()


def test_fairness_alert_names_the_always_dropped_slow_client() -> None:
    # four 10 s devices in lockstep (τ 0 to 3, all within τ_max = 3) and one of 200 s: by the
    # time the slow one reports, about 80 versions have gone by, so all its updates are dropped
    sim_config = config(
        fleet=fixed_fleet([10.0] * 4 + [200.0]),
        budget={"max_updates": 100_000, "max_seconds": 1800},
        algorithms=[
            {
                "kind": "fedasync",
                "tau_max": 3,
                "rules": {
                    "interval_s": 30,
                    "fairness_min_rate": 0.1,
                    "fairness_decisions": 5,
                    "cooldown_s": 600,
                },
            }
        ],
    )
    sim = simulate(sim_config)
    [result] = sim.results
    slow = sim.world.client_ids[4]
    assert result.recorder.applied[4] == 0
    assert result.recorder.submitted[4] >= 5
    fairness = [a for a in result.alerts if a["rule"] == "fairness"]
    assert {a["client"] for a in fairness} == {slow}
    assert "0 of its last 5" in fairness[0]["message"]
    # the first alert comes at the first evaluation after its fifth dropped update
    fifth = [d.time_s for d in result.recorder.decisions if d.device == 4][4]
    assert fifth <= fairness[0]["at_s"] < fifth + 30
    assert build_summary(sim)["algorithms"]["fedasync"]["alerts"] == list(result.alerts)


def test_rules_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="lag_high and lag_low"):
        config(algorithms=[{"kind": "fedasync", "rules": {"lag_high": 5}}])
    with pytest.raises(ConfigError, match="rate_rule"):  # the former form is gone: use rules
        config(algorithms=[{"kind": "fedasync", "rate_rule": {"rate_high": 1, "rate_low": 0.5}}])
    with pytest.raises(ConfigError, match="overlap"):
        config(
            fleet={
                "phases": [
                    {"from_s": 0, "until_s": 100, "latency_factor": 0.5},
                    {"from_s": 50, "until_s": 150, "latency_factor": 2},
                ]
            }
        )
