"""The policy value: validated, immutable, versioned, serialisable, comparable."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fedasync.shared.params import Conflict, ParamError
from fedasync.shared.policy import POLICY_RANGES, Mode, Policy
from fedasync.shared.staleness import Decay


@pytest.mark.parametrize(
    ("param", "value", "allowed"),
    [
        ("alpha0", 0.0, "[0.001, 1]"),
        ("alpha0", 1.5, "[0.001, 1]"),
        ("gamma", 0.0, "(0, 10]"),
        ("lam", 1.2, "[0.5, 1]"),
        ("hinge_a", -1.0, "(0, 1000]"),
        ("hinge_b", 2.5, "integer in [0, 1000]"),
        ("tau_max", -1, "integer in [0, 1000]"),
        ("tau_max", 1001, "integer in [0, 1000]"),
        ("buffer_size", 0, "integer in [1, 10000]"),
        ("server_lr", float("nan"), "(0, 10]"),
        ("alpha0", True, "[0.001, 1]"),
    ],
)
def test_out_of_range_names_param_and_range(param: str, value: object, allowed: str) -> None:
    with pytest.raises(ParamError) as info:
        Policy(**{param: value})  # type: ignore[arg-type]
    assert info.value.param == param
    assert info.value.allowed == allowed
    assert param in str(info.value)
    assert allowed in str(info.value)


def test_unknown_enum_values_are_refused_with_choices() -> None:
    with pytest.raises(ParamError, match="decay") as info:
        Policy(decay="linear")  # type: ignore[arg-type]
    assert "polynomial" in info.value.allowed
    with pytest.raises(ParamError, match="mode"):
        Policy(mode="sync")  # type: ignore[arg-type]


def test_strings_become_enums_and_ints_become_floats() -> None:
    policy = Policy(decay="hinge", mode="fedbuff", alpha0=1)  # type: ignore[arg-type]
    assert policy.decay is Decay.HINGE
    assert policy.mode is Mode.FEDBUFF
    assert isinstance(policy.alpha0, float)


def test_immutable() -> None:
    policy = Policy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.alpha0 = 0.1  # type: ignore[misc]


def test_round_trip_through_json() -> None:
    policy = Policy(version=7, decay=Decay.EXPONENTIAL, lam=0.85, tau_max=12)
    text = json.dumps(policy.to_dict())
    again = Policy.from_dict(json.loads(text))
    assert again == policy
    assert hash(again) == hash(policy)


def test_from_dict_refuses_unknown_keys() -> None:
    with pytest.raises(ParamError) as info:
        Policy.from_dict({"alpha0": 0.5, "alpha": 0.5})
    assert info.value.param == "alpha"


def test_evolve_bumps_version_and_validates() -> None:
    first = Policy()
    second = first.evolve(gamma=0.8)
    assert (second.version, second.gamma, first.gamma) == (1, 0.8, 0.6)
    assert first < second
    assert max([second, first]) is second
    with pytest.raises(ParamError):
        first.evolve(gamma=-1)
    with pytest.raises(ParamError, match="version"):
        first.evolve(version=5)


def test_fedbuff_preset_uses_the_papers_weight() -> None:
    policy = Policy.fedbuff(buffer_size=5)
    assert policy.mode is Mode.FEDBUFF
    assert policy.staleness(3, t=0) == pytest.approx(0.5)  # 1/√(1+3)


def test_every_numeric_field_has_a_range() -> None:
    named = ("mode", "decay", "norm_action", "server_optimizer", "paused", "ingest_paused")
    named += ("stopped",)
    named += ("max_updates", "max_seconds", "robust", "privacy_model")
    numeric = {f.name for f in dataclasses.fields(Policy) if f.name not in named}
    assert numeric == set(POLICY_RANGES)


def test_paused_must_be_a_bool() -> None:
    assert Policy(paused=True).paused is True
    with pytest.raises(ParamError, match="paused"):
        Policy(paused="yes")  # type: ignore[arg-type]
    assert Policy(ingest_paused=True).ingest_paused is True
    with pytest.raises(ParamError, match="ingest_paused"):
        Policy(ingest_paused=1)  # type: ignore[arg-type]


def test_stopped_is_one_way_a_conflict_to_undo() -> None:
    stopped = Policy().evolve(stopped=True)
    assert (stopped.stopped, stopped.version) == (True, 1)
    with pytest.raises(Conflict, match="a stopped run stays stopped") as refused:
        stopped.evolve(stopped=False)
    assert refused.value.param == "stopped"
    with pytest.raises(Conflict):  # the refusal is of the change, whatever else comes with it
        stopped.evolve(stopped=False, alpha0=0.3)
    assert stopped.evolve(stopped=True).stopped is True  # saying it again changes nothing
    assert stopped.evolve(alpha0=0.3).stopped is True  # and other changes keep it
    with pytest.raises(ParamError, match="stopped"):
        Policy(stopped=1)  # type: ignore[arg-type]


def test_stopped_is_quiet_a_run_that_never_stops_records_the_policy_it_always_had() -> None:
    assert "stopped" not in Policy().to_dict()
    assert Policy().to_dict(complete=True)["stopped"] is False
    assert Policy(stopped=True).to_dict()["stopped"] is True
    assert Policy.from_dict(Policy(stopped=True).to_dict()).stopped is True


def test_budgets_are_optional_and_checked() -> None:
    assert Policy().max_updates is None
    assert Policy(max_updates=5, max_seconds=60).max_seconds == 60.0
    with pytest.raises(ParamError, match="max_updates"):
        Policy(max_updates=0)
    with pytest.raises(ParamError, match="max_seconds"):
        Policy(max_seconds=-1.0)
