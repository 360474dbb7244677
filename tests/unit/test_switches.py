"""Degrade switches: documented changes of the policy that turning off restores exactly."""

from __future__ import annotations

import pytest

from fedasync.shared.policy import Policy
from fedasync.shared.switches import SWITCHES, SwitchError, switch_off, switch_on


@pytest.mark.parametrize(
    ("name", "param", "value"),
    [
        ("raise-gamma", "gamma", 0.9),
        ("lower-alpha", "alpha0", 0.3),
        ("freshest-only", "tau_max", 0),
    ],
)
def test_each_switch_changes_its_parameter_and_off_restores_it(
    name: str, param: str, value: float
) -> None:
    policy = Policy(version=4)
    on, saved = switch_on(policy, name)
    assert getattr(on, param) == value  # exactly: 0.6 + 0.3 would be 0.8999999999999999
    assert repr(getattr(on, param)) == repr(value)  # as every view shows it
    assert on.version == 5
    off = switch_off(on, saved)
    assert off.version == 6
    assert off.to_dict() | {"version": 4} == policy.to_dict()


def test_switches_stay_in_range() -> None:
    high = Policy(gamma=9.9, alpha0=0.0015)
    assert switch_on(high, "raise-gamma")[0].gamma == 10.0
    assert switch_on(high, "lower-alpha")[0].alpha0 == 0.001


def test_unknown_switch() -> None:
    with pytest.raises(SwitchError, match="known"):
        switch_on(Policy(), "pause-everything")


def test_every_switch_is_documented() -> None:
    assert all(len(s.description) > 20 for s in SWITCHES.values())
