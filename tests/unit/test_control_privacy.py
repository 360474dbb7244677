"""The privacy guards of the control service (services/control/privacy.py), without Redis: which
runtime changes of the DP fields a run may take, and what `/v1/status` shows."""

from __future__ import annotations

import pytest

from fedasync.services.control.privacy import Spent, privacy_refusal, privacy_status
from fedasync.shared.params import Conflict
from fedasync.shared.policy import Policy

DP = Policy(dp_clip=1.0, dp_population=100, dp_participation=10, privacy_budget=8.0)
SPENT = Spent(sampled=0.5, conservative=3.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"privacy_budget": 9.0}, "privacy_budget"),  # raised
        ({"privacy_budget": None}, "privacy_budget"),  # unset
        ({"privacy_model": "sampled"}, "privacy_model"),  # recounted
        ({"dp_clip": None}, "dp_clip"),  # DP turned off
    ],
)
def test_a_change_no_dp_run_may_take_is_the_cores_to_refuse(
    changes: dict[str, object], field: str
) -> None:
    """One rule, in the core: `evolve` refuses it, naming the field (the API's 409)."""
    with pytest.raises(Conflict) as refused:
        DP.evolve(**changes)
    assert refused.value.param == field


@pytest.mark.parametrize("budget", [3.0, 2.0])  # at what is spent, below it
def test_a_budget_already_spent_is_refused_here_naming_its_field(budget: float) -> None:
    refused = privacy_refusal(DP, DP.evolve(privacy_budget=budget), SPENT)
    assert refused is not None
    assert refused.field == "privacy_budget"
    assert refused.body()["field"] == "privacy_budget"


def test_what_is_spent_is_in_the_refusal_of_a_budget_already_spent() -> None:
    refused = privacy_refusal(DP, DP.evolve(privacy_budget=2.0), SPENT)
    assert refused is not None
    assert refused.body()["used"] == 3.0


@pytest.mark.parametrize(
    "changes",
    [{"privacy_budget": 5.0}, {"dp_clip": 2.0}, {"dp_noise": 2.0}, {"alpha0": 0.3}],
)
def test_lowering_the_budget_and_other_changes_are_taken(changes: dict[str, object]) -> None:
    assert privacy_refusal(DP, DP.evolve(**changes), SPENT) is None


def test_a_first_budget_may_be_set_above_what_is_spent_and_under_either_model() -> None:
    none = Policy(dp_clip=1.0, dp_population=100, dp_participation=10)
    assert privacy_refusal(none, none.evolve(privacy_budget=4.0), SPENT) is None
    counted = Policy(dp_clip=1.0, dp_population=100, privacy_model="sampled")
    sampled = counted.evolve(privacy_budget=1.0)
    assert privacy_refusal(counted, sampled, SPENT) is None  # 1.0 > the sampled 0.5
    conservative = none.evolve(privacy_budget=1.0)
    refused = privacy_refusal(none, conservative, SPENT)  # 1.0 < the conservative 3.0
    assert refused is not None
    assert refused.used == 3.0


def test_status_shows_privacy_only_with_dp_on() -> None:
    assert privacy_status(Policy(), Spent()) is None
    assert privacy_status(DP, SPENT) == {
        "epsilon_sampled": 0.5,
        "epsilon_conservative": 3.0,
        "delta": 1e-5,
        "budget": 8.0,
        "model": "conservative",
        "clip": 1.0,
        "clip_configured": 1.0,
    }


def test_status_shows_the_adaptive_clip_the_newest_decision_recorded_as_the_clip() -> None:
    record = {"epsilon_sampled": 0.5, "epsilon_conservative": 3.0, "adaptive_clip": 0.7}
    spent = Spent.in_record(record)
    assert spent == Spent(0.5, 3.0, 0.7)
    privacy = privacy_status(DP, spent)
    assert privacy is not None
    assert (privacy["clip"], privacy["clip_configured"]) == (0.7, 1.0)
