"""When a simulated run has stopped learning: many refusals and nothing applied since.

A run in which every update is refused (a task whose `train` returns the wrong size, NaNs, a norm
bound that refuses everything) would otherwise go on to its simulated budget, hours of it, and
report nothing. It is judged in simulated terms only, decisions counted, never wall time, so a
config and seed end at the same decision on any machine, however loaded.

Only rejections count towards the end. Drops cannot stall a run: while nothing is applied the
model version stands still, τ stops growing, and the next updates are fresh again; a burst of
stale updates (a million devices that all started from version 0) is normal and ends by itself.
So drops neither count nor break a streak; an applied update does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fedasync.shared.decision import Decision, Outcome

#: rejected updates with none applied since the first of them: the run ends as "stalled"
STALL_REFUSALS = 200
#: the reasons' keys ("dropped stale"), by (outcome, reason): formatted once per pair
_KEYS: dict[tuple[Outcome, str | None], str] = {}


@dataclass(slots=True)
class Stall:
    """The decisions since the last applied update: rejections counted, and why each was."""

    limit: int = STALL_REFUSALS
    #: rejections since the last applied update
    streak: int = 0
    #: "outcome reason" of the decisions since the last applied update (drops included),
    #: e.g. "rejected shape_mismatch"
    reasons: Counter[str] = field(default_factory=Counter)
    #: the latest detail of a rejection among them (e.g. "shape (16,), expected (15,)")
    detail: str = ""

    @property
    def stalled(self) -> bool:
        return self.streak >= self.limit

    def applied(self) -> None:
        """An update was applied: the streak ends."""
        if self.reasons:
            self.streak = 0
            self.reasons.clear()
            self.detail = ""

    def decided(self, decision: Decision) -> None:
        """Count one decision of the core (or one of FedAvg's refusals, decided alike)."""
        if decision.applied:
            self.applied()
            return
        outcome, reason = decision.outcome, decision.reason
        key = _KEYS.get((outcome, reason))
        if key is None:  # "outcome reason", made once per pair: a drop is a million at 100K
            what = outcome.value
            key = _KEYS[outcome, reason] = what if reason is None else f"{what} {reason}"
        self.reasons[key] += 1
        if decision.outcome is Outcome.REJECTED:
            self.streak += 1
            self.detail = decision.detail or self.detail

    def why(self) -> str:
        """One line: the refusals since the last applied update, every reason with its count."""
        parts = ", ".join(f"{n} {what}" for what, n in sorted(self.reasons.items()))
        detail = f" (last: {self.detail})" if self.detail else ""
        return f"{self.streak} updates refused and none applied since: {parts}{detail}"
