"""shared/continuity.py on hand-made values: what a commit leaves passes, what a loss fails."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fedasync.shared.continuity import (
    Check,
    Found,
    GroupPosition,
    entry_id,
    mismatches,
    regressed,
)

#: a fresh deployment: the aggregator created the group (at 0-0, nothing read) and nothing else
FRESH = Found(
    commit_seq=0,
    state_version=None,
    version=None,
    model_kept=False,
    ledger_length=0,
    last_decision_version=None,
    last_decision_entry=None,
    group=GroupPosition("0-0", None, 0),
)
#: after 7 commits: version 5, the last decision on entry 1700-3, the group a little ahead
COMMITTED = Found(
    commit_seq=7,
    state_version=5,
    version=5,
    model_kept=True,
    ledger_length=9,
    last_decision_version=5,
    last_decision_entry="1700-3",
    group=GroupPosition("1800-0", 11, 2),
    started=True,
)


def checks(found: Found) -> set[Check]:
    return {m.check for m in mismatches(found)}


@pytest.mark.parametrize(
    "found",
    [
        FRESH,
        replace(FRESH, group=None),  # first start ever: not even a stream
        replace(FRESH, group=GroupPosition("0-0", 0, 0)),  # Redis 7.2 reports 0, not null
        COMMITTED,
        # the group has delivered entries the aggregator has not committed yet (killed -9
        # between read and commit): they are pending and will be decided again, as designed
        replace(COMMITTED, group=GroupPosition("9999-0", None, 40)),
        # only the genesis commit, or commits of dead letters only: no ledger record
        replace(
            COMMITTED,
            state_version=0,
            version=0,
            ledger_length=0,
            last_decision_version=None,
            last_decision_entry=None,
        ),
        # the last decision was a drop: the version stays, the entry moves
        replace(COMMITTED, last_decision_entry="1799-9"),
    ],
    ids=["fresh", "no-stream", "entries-read-0", "committed", "pending", "no-decision", "drop"],
)
def test_what_a_commit_leaves_passes(found: Found) -> None:
    assert mismatches(found) == []


def test_the_observed_loss_is_caught() -> None:
    """Issue 12: the AOF lost every MULTI/EXEC (commits, ledger, acknowledgements) and kept the
    plain writes: the XADDs, the group, the single-entry reads (XCLAIM ... LASTID) and the start
    time. No commit, a group that has delivered entries, which are pending."""
    found = replace(FRESH, group=GroupPosition("1796-0", None, 124), started=True)
    assert checks(found) == {Check.GROUP_AHEAD_OF_GENESIS, Check.STARTED_WITHOUT_COMMIT}
    assert any("1796-0" in str(m) for m in mismatches(found))
    # reads of several entries are logged as MULTI/EXEC too: then the group is back at 0-0,
    # and the start time alone tells
    assert checks(replace(FRESH, started=True)) == {Check.STARTED_WITHOUT_COMMIT}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"ledger_length": 3, "last_decision_version": 2}, Check.LEDGER_WITHOUT_COMMIT),
        ({"state_version": 4}, Check.STATE_WITHOUT_COMMIT),
        ({"version": 4}, Check.STATE_WITHOUT_COMMIT),
        ({"group": GroupPosition("0-0", 5, 0)}, Check.GROUP_AHEAD_OF_GENESIS),
        ({"group": GroupPosition("0-0", None, 1)}, Check.GROUP_AHEAD_OF_GENESIS),
        ({"group": GroupPosition("0-1", None, 0)}, Check.GROUP_AHEAD_OF_GENESIS),
        ({"started": True}, Check.STARTED_WITHOUT_COMMIT),
    ],
)
def test_anything_only_a_commit_writes_contradicts_commit_zero(
    change: dict[str, Any], expected: Check
) -> None:
    assert checks(replace(FRESH, **change)) == {expected}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"state_version": None}, {Check.STATE_MISSING}),
        ({"model_kept": False}, {Check.MODEL_MISSING}),
        ({"version": None, "model_kept": False}, {Check.MODEL_MISSING}),
        # the state went back a commit, the version key and the ledger did not
        ({"state_version": 4}, {Check.STATE_VERSION, Check.LEDGER_VERSION}),
        # the ledger lost its newest records
        ({"last_decision_version": 3}, {Check.LEDGER_VERSION}),
        # the ledger is gone, the state says 5 updates were applied
        (
            {"ledger_length": 0, "last_decision_version": None, "last_decision_entry": None},
            {Check.LEDGER_VERSION},
        ),
        ({"group": None}, {Check.GROUP_MISSING}),
        # the group was recreated, or went back: it would deliver decided entries again
        ({"group": GroupPosition("1700-2", 9, 0)}, {Check.GROUP_BEHIND_LEDGER}),
        ({"group": GroupPosition("0-0", None, 0)}, {Check.GROUP_BEHIND_LEDGER}),
    ],
)
def test_a_committed_state_must_match_version_ledger_and_group(
    change: dict[str, Any], expected: set[Check]
) -> None:
    assert checks(replace(COMMITTED, **change)) == expected


def test_entry_ids_compare_as_numbers() -> None:
    assert entry_id("9-0") < entry_id("10-0")
    assert entry_id("10-2") < entry_id("10-10")
    assert entry_id("0-0") == (0, 0)
    group_ahead = replace(COMMITTED, last_decision_entry="9-5", group=GroupPosition("10-0", 1, 0))
    assert mismatches(group_ahead) == []


@pytest.mark.parametrize(
    ("served", "reported", "expected"),
    [
        (None, None, False),  # nothing served yet: nothing to compare
        (None, 3, False),
        (3, 3, False),
        (3, 4, False),
        (3, 2, True),
        (3, None, True),  # the version key is gone: Redis lost everything
        (0, None, True),
    ],
)
def test_regressed(served: int | None, reported: int | None, expected: bool) -> None:
    assert regressed(served, reported) is expected
