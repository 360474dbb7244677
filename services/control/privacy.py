"""Differential privacy as the control service shows and guards it: `/v1/status`'s `privacy`,
and the runtime changes of the privacy fields a run may never take back.

ε is what the ledger says: each record carries the ε after its decision (`epsilon_sampled`,
`epsilon_conservative`, written by the core), and, when the clip adapts, the clip C in force
(`adaptive_clip`), so the control service, which never reads the noise secret or the state,
shows what the aggregator committed. The core refuses what no DP run
may take (`Policy.evolve`: DP turned off, a budget raised or unset, another accounting model);
the guard here is the one that needs the run's figures: a budget never set at or below what is
already spent (that would end training at once, as a used-up `max_updates` would).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedasync.shared.policy import Policy

#: the policy fields whose runtime change is checked here
PRIVACY_FIELDS = frozenset({"privacy_budget"})


@dataclass(frozen=True, slots=True)
class Spent:
    """ε spent so far under each model, as the newest ledger record carrying it says; None
    where the run reports none (no DP yet, or sampled without the population N). With an
    adaptive clip, also the clip C that record says is in force (None: the policy's `dp_clip`
    is the C, a fixed clip)."""

    sampled: float | None = None
    conservative: float | None = None
    adaptive_clip: float | None = None

    @classmethod
    def in_record(cls, record: Mapping[str, Any]) -> Spent | None:
        """The ε (and adaptive clip) a ledger record carries (the core writes them on every
        decision of a DP run), or None for a record without them."""
        if "epsilon_sampled" in record or "epsilon_conservative" in record:
            return cls(
                record.get("epsilon_sampled"),
                record.get("epsilon_conservative"),
                record.get("adaptive_clip"),
            )
        return None

    def of(self, policy: Policy) -> float | None:
        """The ε the policy's budget counts (its `privacy_model`)."""
        return self.sampled if policy.privacy_model == "sampled" else self.conservative


def privacy_status(policy: Policy, spent: Spent) -> dict[str, Any] | None:
    """`/v1/status`'s `privacy`: None while DP is off and nothing was ever spent.

    `clip` is the C updates are clipped to now: the adaptive clip the newest decision recorded
    (it has moved away from `dp_clip` since the first step), else the policy's; the policy's
    stays visible as `clip_configured`."""
    if policy.dp_clip is None and spent == Spent():
        return None
    return {
        "epsilon_sampled": spent.sampled,
        "epsilon_conservative": spent.conservative,
        "delta": policy.dp_delta,
        "budget": policy.privacy_budget,
        "model": str(policy.privacy_model),
        "clip": policy.dp_clip if spent.adaptive_clip is None else spent.adaptive_clip,
        "clip_configured": policy.dp_clip,
    }


@dataclass(frozen=True, slots=True)
class Refusal:
    """A privacy change the run cannot take: the field, why, and what was spent."""

    field: str
    message: str
    used: float | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message, "field": self.field}
        if self.used is not None:
            out["used"] = self.used
        return out


def privacy_refusal(current: Policy, new: Policy, spent: Spent) -> Refusal | None:
    """Why `new` may not follow `current` in a run that spent `spent`, or None.

    What a change may never do to a DP run whatever it has spent (turn DP off, raise or unset
    the budget, count it under another model) the core refuses in `Policy.evolve`, before this
    is asked; what is refused here needs the run's figures: a budget at or below the ε spent."""
    was, now = current.privacy_budget, new.privacy_budget
    if now is not None and now != was:
        used = spent.of(new)
        if used is not None and now <= used:
            return Refusal(
                "privacy_budget",
                f"privacy_budget {now:g} is already spent: ε ({new.privacy_model}) is "
                f"{used:g}; to end training now, pause aggregation (`paused`)",
                used,
            )
    return None
