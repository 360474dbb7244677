"""Does what Redis holds hang together? A move back in time shows up here as a mismatch.

Every commit writes state, model, version, ledger records and acknowledgements in one script,
so in a Redis that lost nothing they always agree. When Redis loses writes (an AOF whose
MULTI/EXEC blocks were skipped on replay, a restore from an older backup, a failover to a replica
that missed commits), what survives can disagree: no commit at all but a consumer group that has
delivered entries, or a state one version behind its ledger. An aggregator that started anyway
would re-decide old entries from an older state and hand out version numbers that already named
other models. `mismatches` finds these cases from a few plain values that are cheap to read (a
handful of GETs, XLEN, the last ledger entry, XINFO GROUPS), so the aggregator can refuse to
start instead; `regressed` is the snapshot service's check of the version Redis reports against
the one it has served.

Pure: values in, findings out, so each case is unit-tested on hand-made values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Check(StrEnum):
    """What disagreed; the label of the metric and the alert."""

    LEDGER_WITHOUT_COMMIT = "ledger-without-commit"
    STATE_WITHOUT_COMMIT = "state-without-commit"
    STARTED_WITHOUT_COMMIT = "started-without-commit"
    GROUP_AHEAD_OF_GENESIS = "group-ahead-of-genesis"
    STATE_MISSING = "state-missing"
    MODEL_MISSING = "model-missing"
    STATE_VERSION = "state-version"
    LEDGER_VERSION = "ledger-version"
    GROUP_MISSING = "group-missing"
    GROUP_BEHIND_LEDGER = "group-behind-ledger"
    COMMIT_SEQ_MOVED = "commit-seq-moved"
    #: a commit found an entry it acknowledges not pending: the read that delivered it was lost
    GROUP_LOST_DELIVERY = "group-lost-delivery"
    #: the state names a client's remembered delta (memory mode) that `{p}:memory` lacks
    MEMORY_MISSING = "memory-missing"


@dataclass(frozen=True, slots=True)
class Mismatch:
    check: Check
    detail: str

    def __str__(self) -> str:
        return f"{self.check.value}: {self.detail}"


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """The aggregator's consumer group as XINFO GROUPS reports it."""

    last_delivered: str  # entry id, "ms-seq"
    entries_read: int | None  # None: Redis cannot tell (6.2, or after XCLAIM ... LASTID)
    pending: int


@dataclass(frozen=True, slots=True)
class Found:
    """What the aggregator reads before it decides anything (after raising the epoch)."""

    commit_seq: int
    #: the version in the `{p}:state` checkpoint; None when there is no state
    state_version: int | None
    #: `{p}:version`; None when absent
    version: int | None
    #: `{p}:model:{version}` exists
    model_kept: bool
    #: XLEN of the ledger
    ledger_length: int
    #: the version the last ledger record left the model at, and that record's stream entry id
    last_decision_version: int | None
    last_decision_entry: str | None
    #: None when the updates stream or the group does not exist
    group: GroupPosition | None
    #: `{p}:started-at` exists: the aggregator writes it after the first commit, on its own
    started: bool = False


def entry_id(text: str) -> tuple[int, int]:
    """A stream entry id as a comparable pair ("1700000000000-3" → (1700000000000, 3))."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def mismatches(found: Found) -> list[Mismatch]:
    """Every way `found` contradicts itself; empty when it may be what the last commit left.

    Before the first commit (commit sequence 0) nothing may exist that only a commit writes, that is
    written only after one, or that only a reading aggregator moves: no ledger, no state or version,
    no start time, a group at 0-0 with nothing delivered. After it, state, version and model agree,
    the ledger's last record ends at the state's version (no record at all: version 0, since the
    aggregator starts from a fresh state), and the group exists and has delivered at least the last
    decided entry.
    """
    if found.commit_seq == 0:
        return _at_genesis(found)
    out: list[Mismatch] = []
    if found.state_version is None:
        out.append(Mismatch(Check.STATE_MISSING, f"commit {found.commit_seq} but no state"))
    if found.version is None or not found.model_kept:
        out.append(
            Mismatch(
                Check.MODEL_MISSING,
                f"commit {found.commit_seq} but "
                + ("no version" if found.version is None else f"no model {found.version}"),
            )
        )
    state = found.state_version
    if state is not None and found.version is not None and state != found.version:
        out.append(
            Mismatch(Check.STATE_VERSION, f"state at version {state}, version key {found.version}")
        )
    ledger = found.last_decision_version if found.ledger_length else 0
    if state is not None and ledger != state:
        what = "an empty ledger" if not found.ledger_length else f"the ledger ends at {ledger}"
        out.append(Mismatch(Check.LEDGER_VERSION, f"state at version {state}, {what}"))
    group, decided = found.group, found.last_decision_entry
    if group is None:
        out.append(Mismatch(Check.GROUP_MISSING, f"commit {found.commit_seq} but no group"))
    elif decided is not None and entry_id(group.last_delivered) < entry_id(decided):
        out.append(
            Mismatch(
                Check.GROUP_BEHIND_LEDGER,
                f"group delivered up to {group.last_delivered}, the ledger decided {decided}",
            )
        )
    return out


def _at_genesis(found: Found) -> list[Mismatch]:
    out: list[Mismatch] = []
    if found.ledger_length:
        out.append(
            Mismatch(
                Check.LEDGER_WITHOUT_COMMIT,
                f"no commit but {found.ledger_length} decisions in the ledger",
            )
        )
    if found.state_version is not None or found.version is not None:
        out.append(
            Mismatch(
                Check.STATE_WITHOUT_COMMIT,
                f"no commit but state version {found.state_version}, version key {found.version}",
            )
        )
    if found.started:
        out.append(
            Mismatch(
                Check.STARTED_WITHOUT_COMMIT,
                "no commit, but the start time written after the first commit is there",
            )
        )
    group = found.group
    if group is not None and (
        entry_id(group.last_delivered) != (0, 0) or (group.entries_read or 0) > 0 or group.pending
    ):
        out.append(
            Mismatch(
                Check.GROUP_AHEAD_OF_GENESIS,
                f"no commit but the group delivered up to {group.last_delivered} "
                f"({group.entries_read} read, {group.pending} pending)",
            )
        )
    return out


def regressed(served: int | None, reported: int | None) -> bool:
    """The snapshot service has served `served`; Redis now reports `reported` (None: no version
    at all). Versions only grow, so anything lower, or nothing, means Redis lost commits."""
    return served is not None and (reported is None or reported < served)
