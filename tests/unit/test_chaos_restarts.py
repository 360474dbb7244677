"""The chaos harness's Redis restart check (chaos/restarts.py `compare`) on hand-made readings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fedasync.services.commands.chaos.restarts import Marks, RestartCheck, compare
from fedasync.shared.continuity import Found, GroupPosition

KEEP = 20

BEFORE = Marks(
    found=Found(
        commit_seq=40,
        state_version=30,
        version=30,
        model_kept=True,
        ledger_length=50,
        last_decision_version=30,
        last_decision_entry="1000-4",
        group=GroupPosition("1000-6", 52, 2),
        started=True,
    ),
    state_sha="s40",
    model_sha="m30",
    ledger_last_id="2000-0",
    ledger_last_sha="l50",
    updates_length=52,
    updates_last_id="1000-6",
)
#: the reading after a restart that kept everything, before any new commit
SAME = replace(BEFORE, earlier_model_sha="m30", earlier_ledger_sha="l50")


def after(**changes: Any) -> Marks:
    found = {k: v for k, v in changes.items() if k in Found.__slots__}
    marks = {k: v for k, v in changes.items() if k not in found}
    return replace(SAME, found=replace(SAME.found, **found), **marks)


#: two commits landed after the restart: 5 more versions, 6 more decisions
MOVED_ON = after(
    commit_seq=42,
    state_version=35,
    version=35,
    ledger_length=56,
    last_decision_version=35,
    last_decision_entry="1000-12",
    group=GroupPosition("1000-12", 58, 0),
    state_sha="s42",
    model_sha="m35",
    ledger_last_id="2001-0",
    ledger_last_sha="l56",
    updates_length=58,
    updates_last_id="1000-12",
)


def test_a_restart_that_kept_everything_is_intact() -> None:
    assert compare(BEFORE, SAME, KEEP) == []


def test_commits_after_the_restart_are_not_a_loss() -> None:
    assert compare(BEFORE, MOVED_ON, KEEP) == []
    # a commit far enough on may have dropped the old model: that is the keep window, not a loss
    far = replace(
        MOVED_ON, found=replace(MOVED_ON.found, version=55, state_version=55), earlier_model_sha=""
    )
    far = replace(far, found=replace(far.found, last_decision_version=55))
    assert compare(BEFORE, far, KEEP) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"commit_seq": 39}, "commit sequence went back"),
        ({"state_sha": "other"}, "state changed without a commit"),
        ({"model_sha": "other"}, "model changed without a commit"),
        ({"earlier_model_sha": ""}, "model 30 lost"),
        ({"earlier_ledger_sha": ""}, "ledger entry 2000-0 lost"),
        ({"earlier_ledger_sha": "l49"}, "ledger entry 2000-0 lost or changed"),
        ({"group": GroupPosition("1000-5", 51, 2)}, "consumer group lost or moved back"),
        ({"group": None}, "consumer group lost"),
        ({"updates_length": 51, "updates_last_id": "1000-5"}, "updates stream lost entries"),
        ({"started": False}, "start time lost"),
    ],
)
def test_whatever_a_restart_lost_is_reported(changes: dict[str, Any], expected: str) -> None:
    problems = compare(BEFORE, after(**changes), KEEP)
    assert any(expected in p for p in problems), problems


def test_the_observed_loss_is_reported_from_both_sides() -> None:
    """Every commit gone, the plain writes kept: the sequence went back, and what is left fails
    the aggregator's own start-up check."""
    lost = after(
        commit_seq=0,
        state_version=None,
        version=None,
        model_kept=False,
        ledger_length=0,
        last_decision_version=None,
        last_decision_entry=None,
        state_sha="",
        model_sha="",
        ledger_last_id=None,
        ledger_last_sha="",
        earlier_model_sha="",
        earlier_ledger_sha="",
    )
    problems = compare(BEFORE, lost, KEEP)
    assert any("commit sequence went back from 40 to 0" in p for p in problems)
    assert any("after the restart, group-ahead-of-genesis" in p for p in problems)
    assert any("after the restart, started-without-commit" in p for p in problems)
    assert any("version went back" in p for p in problems)
    assert any("ledger shrank from 50 to 0" in p for p in problems)


def test_a_check_without_both_readings_is_not_intact() -> None:
    assert not RestartCheck(1.0).intact
    assert not RestartCheck(1.0, before=BEFORE).intact
    assert RestartCheck(1.0, before=BEFORE, after=SAME).intact
    summary = RestartCheck(1.0, before=BEFORE, after=MOVED_ON).to_dict()
    assert summary["commit_seq"] == [40, 42]
    assert summary["ledger"] == [50, 56]
    assert summary["intact"]
