"""Every update decided exactly once: the total-queue check, in the manner of Jepsen's.

One check with three callers: the chaos harness (`fedasync chaos`), the load benchmark
(bench/load.py) and the kill -9 test (tests/integration/test_crash_recovery.py); each keeps its
own report. Pure: it takes what the publishers say (which publishes were attempted, which were
acknowledged, and with which stream entry), the ledger records in commit order and the ids of
the updates stream's entries, and counts. Nothing here talks to Redis, so each way of failing
is unit-tested on a hand-made history.

- lost: acknowledged, and no terminal decision (applied, dropped, rejected) in the ledger;
- duplicated: more than one terminal decision for one update id. A `duplicate` record (the
  dedup memory recognising a re-published update) is no terminal decision: it is counted as
  duplicate-skipped, and is the expected trace of a publish retried after a lost reply;
- unexpected: a decision for an update id no publisher ever attempted;
- indeterminate: attempted but not acknowledged (the worker died mid-XADD, or gave up) and
  decided anyway; legitimate, reported for information;
- version gaps: each decision that took a server step must raise the version by exactly one,
  every other decision must leave it where it was. In FedAsync every applied update is a server
  step; in FedBuff only the K-th of a buffer is (the others record the version in force);
- redecided: one stream entry with more than one ledger record (an entry decided twice);
- undecided: a stream entry with no ledger record and no dead letter;
- wrong entry: when the publisher knows the entry id Redis acknowledged, that entry's ledger
  record must name the same update.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

TERMINAL = frozenset({"applied", "dropped", "rejected"})
DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class Decided:
    """The fields of a ledger record the check needs."""

    update_id: str
    outcome: str
    version: int
    stream_id: str
    #: the decision moved the weights (and so the version); true of every applied FedAsync update
    server_step: bool = True

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Decided:
        outcome = str(record["outcome"])
        return cls(
            str(record["update_id"]),
            outcome,
            int(record["version"]),
            str(record["stream_id"]),
            bool(record.get("server_step", outcome == "applied")),
        )


@dataclass(slots=True)
class Verdict:
    acknowledged: int = 0
    attempted: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    indeterminate: list[str] = field(default_factory=list)
    #: (ledger index, expected version, recorded version) of each break in the version sequence
    version_gaps: list[tuple[int, int, int]] = field(default_factory=list)
    redecided: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    wrong_entry: list[str] = field(default_factory=list)
    #: the version the first applied decision made, and the version after the last decision
    first_version: int = 0
    last_version: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.unexpected
            or self.version_gaps
            or self.redecided
            or self.undecided
            or self.wrong_entry
        )


def check(
    acknowledged: Set[str],
    attempted: Set[str],
    ledger: Iterable[Decided],
    stream_ids: Iterable[str] = (),
    dead_lettered: Set[str] = frozenset(),
    start_version: int = 0,
    entries: Mapping[str, str] | None = None,
) -> Verdict:
    """Count lost, duplicated, unexpected and indeterminate updates and version breaks.

    `attempted` should include the acknowledged ids (a journal writes the attempt first);
    `stream_ids` are the updates stream's entry ids, `dead_lettered` the entry ids refused
    before any decision (undecodable messages, which have no ledger record); `entries`, when
    the publisher kept them, maps each acknowledged update id to the entry id Redis returned.
    """
    verdict = Verdict(len(acknowledged), len(attempted | acknowledged))
    verdict.last_version = start_version
    terminal: dict[str, int] = defaultdict(int)
    per_entry: Counter[str] = Counter()
    named: dict[str, str] = {}  # stream entry → the update id its (first) record names
    version = start_version
    for index, record in enumerate(ledger):
        verdict.outcomes[record.outcome] += 1
        per_entry[record.stream_id] += 1
        named.setdefault(record.stream_id, record.update_id)
        if record.outcome in TERMINAL:
            terminal[record.update_id] += 1
        stepped = record.outcome == "applied" and record.server_step
        expected = version + 1 if stepped else version
        if stepped and not verdict.first_version:
            verdict.first_version = record.version
        if record.version != expected:
            verdict.version_gaps.append((index, expected, record.version))
        version = record.version
        if record.update_id not in attempted and record.update_id not in acknowledged:
            verdict.unexpected.append(record.update_id)
    verdict.last_version = version
    verdict.lost = sorted(uid for uid in acknowledged if terminal.get(uid, 0) == 0)
    verdict.duplicated = sorted(uid for uid, n in terminal.items() if n > 1)
    verdict.unexpected = sorted(set(verdict.unexpected))
    verdict.indeterminate = sorted(
        uid for uid in terminal if uid not in acknowledged and uid in attempted
    )
    verdict.redecided = sorted(entry for entry, n in per_entry.items() if n > 1)
    verdict.undecided = sorted(
        entry for entry in stream_ids if entry not in per_entry and entry not in dead_lettered
    )
    verdict.wrong_entry = sorted(
        uid
        for uid, entry in (entries or {}).items()
        if named.get(entry) != uid and entry not in dead_lettered
    )
    return verdict
