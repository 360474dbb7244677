"""Automatic rules as pure objects: thresholds, hysteresis, hold time, cool-down, no flapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.rules import (
    ActionKind,
    DropAlertRule,
    FairnessRule,
    Figures,
    Hysteresis,
    SwitchRule,
)


def rate_rule() -> SwitchRule:
    gate = Hysteresis(high=100.0, low=60.0, hold_s=10.0, cooldown_s=30.0)
    return SwitchRule("update-rate", "update_rate", "raise-gamma", gate)


def test_a_sustained_spike_raises_gamma_and_calm_restores_it() -> None:
    rule = rate_rule()
    assert rule.evaluate(Figures(now=0, update_rate=150)) == []  # not held long enough yet
    [on] = rule.evaluate(Figures(now=10, update_rate=150))
    assert (on.kind, on.switch) == (ActionKind.SWITCH_ON, "raise-gamma")
    assert rule.evaluate(Figures(now=20, update_rate=80)) == []  # between low and high: stays
    assert rule.evaluate(Figures(now=40, update_rate=50)) == []  # below low: hold starts
    [off] = rule.evaluate(Figures(now=50, update_rate=50))
    assert off.kind is ActionKind.SWITCH_OFF


def test_a_short_spike_does_nothing() -> None:
    rule = rate_rule()
    assert rule.evaluate(Figures(now=0, update_rate=150)) == []
    assert rule.evaluate(Figures(now=5, update_rate=90)) == []  # fell back: hold resets
    assert rule.evaluate(Figures(now=12, update_rate=150)) == []
    assert rule.evaluate(Figures(now=21, update_rate=150)) == []  # 9 s held, not 10


@given(st.lists(st.floats(95, 105), min_size=50, max_size=300))
def test_no_flapping_near_the_threshold(rates: list[float]) -> None:
    """A steady rate hovering at the threshold turns the rule on at most once, never off."""
    rule = rate_rule()
    actions = [a for t, r in enumerate(rates) for a in rule.evaluate(Figures(now=t, update_rate=r))]
    assert [a.kind for a in actions] in ([], [ActionKind.SWITCH_ON])


def test_cooldown_separates_actions() -> None:
    rule = SwitchRule("lag", "lag", "freshest-only", Hysteresis(100, 10, hold_s=0, cooldown_s=60))
    assert rule.evaluate(Figures(now=0, lag=500))[0].kind is ActionKind.SWITCH_ON
    assert rule.evaluate(Figures(now=5, lag=0)) == []  # calm, but still cooling down
    assert rule.evaluate(Figures(now=60, lag=0))[0].kind is ActionKind.SWITCH_OFF


def test_disabled_rules_do_nothing() -> None:
    rule = rate_rule()
    rule.enabled = False
    assert rule.evaluate(Figures(now=100, update_rate=1e9)) == []


def test_drop_alerts() -> None:
    rule = DropAlertRule(max_consecutive=20, max_share=0.5, cooldown_s=60)
    assert rule.evaluate(Figures(now=0, consecutive_drops=5, drop_share=0.2)) == []
    [alert] = rule.evaluate(Figures(now=1, consecutive_drops=20))
    assert "20 consecutive" in alert.message
    assert rule.evaluate(Figures(now=2, consecutive_drops=30)) == []  # cool-down
    [share] = rule.evaluate(Figures(now=70, drop_share=0.6))
    assert "60%" in share.message


def test_fairness_alert_names_the_always_dropped_client() -> None:
    rule = FairnessRule(min_rate=0.2, min_decisions=10, cooldown_s=300)
    clients = {"fast": (50, 50), "slow": (0, 12), "new": (0, 3)}
    [alert] = rule.evaluate(Figures(now=0, clients=clients))
    assert alert.client == "slow"
    assert "0 of its last 12" in alert.message
    assert rule.evaluate(Figures(now=10, clients=clients)) == []  # once per cool-down


def test_hysteresis_levels_are_checked() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        Hysteresis(high=1, low=2, hold_s=0, cooldown_s=0)
