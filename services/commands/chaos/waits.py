"""How long each update waited for its decision, from its XADD to its ledger record.

The XADD time is the stream entry id's millisecond part (set by Redis); the decision time is the
ledger record's `at` (set by the aggregator as it decides; one host, one clock). While an
aggregator runs and Redis answers, no entry waits longer than the aggregator's decision bound
(`AggregatorSettings.decision_bound_s`, docs/architecture.md), whatever another aggregator does.

Some faults stop all deciding for a while: a killed aggregator or Redis, a pause, a stalled
command. Each one that overlaps an entry's wait adds its own length and `RECOVERY_S` (noticing,
backing off, starting a process again) to what that entry may wait. A second aggregator adds
only `RECOVERY_S`, its start: the entries the first one strands meanwhile are the claim's to
take over within the bound, however long the first stays stopped. Pure, so it is unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: what a fault that stops the deciding adds beyond its own length, seconds: a socket timeout
#: and the retry policy's longest backoff (3 s), or an exit, a restart and a Python start
RECOVERY_S = 8.0
#: fault kinds that stop the deciding for their whole length, and the one that needs only a start
STOPS_FOR_ITS_LENGTH = frozenset({"kill_aggregator", "kill_redis", "pause_redis", "stall_redis"})
STOPS_FOR_A_START = frozenset({"second_aggregator"})
#: what a failover stops the deciding for beyond its promotion (measured, chaos/faults.py) and
#: RECOVERY_S, whatever the killed server's own outage: the clients' reconnection, and after a
#: failover that lost commits an aggregator's refusal and its start again, seconds
FAILOVER_S = 10.0
#: entries listed in the figures, at most
EXAMPLES = 20


@dataclass(frozen=True, slots=True)
class Interruption:
    """A fault as it may delay decisions: from `at` (wall clock) for `seconds`."""

    at: float
    seconds: float

    @classmethod
    def of(cls, kind: str, at: float, length_s: float) -> Interruption | None:
        if kind in STOPS_FOR_ITS_LENGTH:
            return cls(at, length_s + RECOVERY_S)
        if kind in STOPS_FOR_A_START:
            return cls(at, RECOVERY_S)
        # a worker killed, the snapshot service restarted: deciding goes on. A failover's
        # length is known only once a replica is promoted: `failover` below
        return None

    @classmethod
    def failover(cls, at: float, promoted_s: float) -> Interruption:
        """A kill of the primary at `at`, a replica promoted `promoted_s` later."""
        return cls(at, promoted_s + FAILOVER_S + RECOVERY_S)


@dataclass(slots=True)
class Waits:
    bound_s: float
    count: int = 0
    longest_s: float = 0.0
    longest_entry: str = ""
    #: (entry id, wait, what it was allowed) of each entry that waited longer than allowed
    over: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.over


def xadd_time(entry_id: str) -> float:
    """When Redis added a stream entry, from its id (milliseconds-sequence), in seconds."""
    return int(entry_id.partition("-")[0]) / 1000


def measure(
    records: Iterable[Mapping[str, Any]],
    bound_s: float,
    interruptions: Iterable[Interruption] = (),
) -> Waits:
    """Every ledger record's wait since its entry's XADD, against the bound plus the length of
    the interruptions that overlap it."""
    faults = sorted(interruptions, key=lambda i: i.at)
    waits = Waits(bound_s)
    for record in records:
        entry = str(record["stream_id"])
        added, decided = xadd_time(entry), float(record["at"])
        wait = decided - added
        allowed = bound_s + sum(
            f.seconds for f in faults if f.at <= decided and f.at + f.seconds >= added
        )
        waits.count += 1
        if wait > waits.longest_s:
            waits.longest_s, waits.longest_entry = wait, entry
        if wait > allowed:
            waits.over.append((entry, round(wait, 3), round(allowed, 3)))
    return waits
