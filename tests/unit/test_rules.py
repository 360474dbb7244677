"""Automatic rules as pure objects: thresholds, hysteresis, hold time, cool-down, no flapping."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from fedasync.shared.rules import (
    ActionKind,
    DropAlertRule,
    FairnessRule,
    Figures,
    Hysteresis,
    SwitchRule,
    build_rules,
    rule_actor,
    sync_switch_rules,
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


HIGH, LOW = 100.0, 60.0  # rate_rule()'s levels


def steady(level: float) -> st.SearchStrategy[list[float]]:
    """Readings hovering within ±3 of `level`: on either side of a threshold, or right at it."""
    return st.lists(st.floats(level - 3, level + 3), min_size=1, max_size=40)


@st.composite
def oscillation(draw: st.DrawFn) -> list[float]:
    """Swings across both levels: above `high` for a while, below `low` as long, repeated."""
    above = draw(st.floats(HIGH, HIGH + 50))
    below = draw(st.floats(LOW - 50, LOW))
    period = draw(st.integers(1, 15))
    return ([above] * period + [below] * period) * draw(st.integers(1, 6))


@dataclass(frozen=True)
class Scenario:
    hold_s: float
    cooldown_s: float
    #: (seconds since the previous reading, rate)
    series: list[tuple[float, float]]

    def run(self) -> list[tuple[float, float, list[ActionKind]]]:
        """Feed the series to a fresh rule: (time, rate, kinds of the actions taken) per reading."""
        gate = Hysteresis(HIGH, LOW, self.hold_s, self.cooldown_s)
        rule = SwitchRule("update-rate", "update_rate", "raise-gamma", gate)
        now, out = 0.0, []
        for gap, rate in self.series:
            now += gap
            actions = rule.evaluate(Figures(now=now, update_rate=rate))
            out.append((now, rate, [a.kind for a in actions]))
        return out


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Segments of steady rates near each level, anywhere between, and oscillations, read at
    uneven intervals, under a hold time and a cool-down either way round."""
    segment = st.one_of(
        steady(HIGH), steady(LOW), st.lists(st.floats(0, 200), max_size=20), oscillation()
    )
    rates = [r for part in draw(st.lists(segment, min_size=1, max_size=8)) for r in part]
    gaps = draw(st.lists(st.sampled_from([0.5, 1.0, 2.5, 5.0]), min_size=len(rates)))
    hold = draw(st.sampled_from([0.0, 2.5, 10.0]))
    cooldown = draw(st.sampled_from([0.0, 5.0, 30.0]))
    return Scenario(hold, cooldown, list(zip(gaps, rates, strict=False)))


def crossing(rate: float, on: bool) -> bool:
    """The condition that would flip the rule from its state `on`."""
    return rate < LOW if on else rate > HIGH


def held_since(readings: list[tuple[float, float, list[ActionKind]]], i: int, after: int) -> float:
    """When the run of readings up to `i` that all meet the condition began: readings after the
    action at `after` (-1: none yet) only, in the state that action left."""
    on = after >= 0 and readings[after][2] == [ActionKind.SWITCH_ON]
    j = i
    while j - 1 > after and crossing(readings[j - 1][1], on):
        j -= 1
    return readings[j][0]


@given(scenarios())
def test_no_flapping(scenario: Scenario) -> None:
    """Whatever the rates: on and off alternate, two actions are at least the cool-down apart,
    and each one comes only after its condition held for hold_s."""
    readings = scenario.run()
    acted = [i for i, (_, _, kinds) in enumerate(readings) if kinds]
    kinds = [k for _, _, ks in readings for k in ks]
    alternating = [ActionKind.SWITCH_ON, ActionKind.SWITCH_OFF] * len(kinds)
    assert kinds == alternating[: len(kinds)]
    for before, after in itertools.pairwise(acted):
        assert readings[after][0] - readings[before][0] >= scenario.cooldown_s
    previous = -1
    for i in acted:
        on_before = readings[i][2] == [ActionKind.SWITCH_OFF]
        assert crossing(readings[i][1], on_before)
        assert readings[i][0] - held_since(readings, i, previous) >= scenario.hold_s
        previous = i


@given(scenarios())
def test_a_condition_held_past_hold_and_cooldown_always_acts(scenario: Scenario) -> None:
    """The other half, so that doing nothing cannot pass for not flapping: at every reading where
    the condition has held for hold_s and the cool-down is over, the rule acts."""
    readings = scenario.run()
    previous, on = -1, False
    for i, (now, rate, kinds) in enumerate(readings):
        due = (
            crossing(rate, on)
            and now - held_since(readings, i, previous) >= scenario.hold_s
            and (previous < 0 or now - readings[previous][0] >= scenario.cooldown_s)
        )
        assert bool(kinds) == due, (i, now, rate)
        if kinds:
            previous, on = i, not on


def test_the_scenarios_do_flip_the_rule_both_ways() -> None:
    """The strategy reaches what the properties are about: runs that turn the rule on and off."""
    both = find(
        scenarios(),
        lambda s: sum(bool(k) for _, _, k in s.run()) >= 3,
        settings=settings(
            database=None, derandomize=True, max_examples=500, phases=[Phase.generate]
        ),
    )
    kinds = [k for _, _, ks in both.run() for k in ks]
    assert kinds[:3] == [ActionKind.SWITCH_ON, ActionKind.SWITCH_OFF, ActionKind.SWITCH_ON]


def test_cooldown_separates_actions() -> None:
    rule = SwitchRule("lag", "lag", "freshest-only", Hysteresis(100, 10, hold_s=0, cooldown_s=60))
    assert rule.evaluate(Figures(now=0, lag=500))[0].kind is ActionKind.SWITCH_ON
    assert rule.evaluate(Figures(now=5, lag=0)) == []  # calm, but still cooling down
    assert rule.evaluate(Figures(now=60, lag=0))[0].kind is ActionKind.SWITCH_OFF


def test_a_rule_restarted_while_its_switch_is_on_turns_it_off_when_calm() -> None:
    rule = rate_rule()  # a fresh rule: in memory, everything is off
    rule.sync(rule_actor("update-rate"))  # what the switches hash says: this rule turned it on
    assert rule.evaluate(Figures(now=0, update_rate=50)) == []  # hold starts
    [off] = rule.evaluate(Figures(now=10, update_rate=50))
    assert (off.kind, off.switch) == (ActionKind.SWITCH_OFF, "raise-gamma")


def test_a_rule_stands_aside_while_an_operator_holds_its_switch() -> None:
    rule = rate_rule()
    rule.sync("ops")
    for now in range(0, 100, 5):
        assert rule.evaluate(Figures(now=now, update_rate=50 if now < 50 else 150)) == []
    rule.sync(None)  # the operator turned it off: the rule decides again
    assert rule.evaluate(Figures(now=100, update_rate=150)) == []
    [on] = rule.evaluate(Figures(now=110, update_rate=150))
    assert on.kind is ActionKind.SWITCH_ON


def test_a_switch_turned_off_elsewhere_is_not_turned_off_again() -> None:
    rule = rate_rule()
    rule.evaluate(Figures(now=0, update_rate=150))
    [on] = rule.evaluate(Figures(now=10, update_rate=150))
    assert on.kind is ActionKind.SWITCH_ON
    rule.sync(None)  # an operator turned it off meanwhile
    assert rule.evaluate(Figures(now=50, update_rate=50)) == []
    assert rule.evaluate(Figures(now=60, update_rate=50)) == []


def test_sync_switch_rules_reads_each_rules_own_switch() -> None:
    rules = build_rules(
        rate_high=100,
        rate_low=60,
        lag_high=10,
        lag_low=5,
        hold_s=0,
        cooldown_s=0,
        max_consecutive_drops=5,
        max_drop_share=0.5,
        fairness_min_rate=0.1,
        fairness_decisions=10,
    )
    sync_switch_rules(rules, {"freshest-only": rule_actor("lag"), "raise-gamma": "ops"})
    rate, lag, memory = (r for r in rules if isinstance(r, SwitchRule))
    assert (rate.gate.active, rate.overridden) == (False, True)
    assert (lag.gate.active, lag.overridden) == (True, False)
    assert (memory.gate.active, memory.overridden) == (False, False)


def test_memory_rule_pauses_ingest_and_alerts_near_the_limit_then_resumes() -> None:
    rules = build_rules(
        rate_high=100,
        rate_low=60,
        lag_high=10,
        lag_low=5,
        hold_s=5,
        cooldown_s=0,
        max_consecutive_drops=5,
        max_drop_share=0.5,
        fairness_min_rate=0.1,
        fairness_decisions=10,
        memory_high=0.8,
        memory_low=0.6,
    )
    (memory,) = (r for r in rules if r.name == "memory")
    assert memory.evaluate(Figures(now=0, memory_share=0.85)) == []  # held 5 s first
    actions = memory.evaluate(Figures(now=5, memory_share=0.9))
    assert [(a.kind, a.switch) for a in actions] == [
        (ActionKind.SWITCH_ON, "pause-ingest"),
        (ActionKind.ALERT, None),
    ]
    assert "pause-ingest on" in actions[1].message
    assert memory.evaluate(Figures(now=10, memory_share=0.7)) == []  # between the levels
    memory.evaluate(Figures(now=11, memory_share=0.5))
    actions = memory.evaluate(Figures(now=16, memory_share=0.5))
    assert [(a.kind, a.switch) for a in actions] == [(ActionKind.SWITCH_OFF, "pause-ingest")]


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
