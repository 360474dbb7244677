"""Differential privacy as the control service shows and guards it: `/v1/status`'s `privacy`,
and the runtime changes of the privacy fields a run may never take back.

ε is what the ledger says: each record carries the ε after its decision (`epsilon_sampled`,
`epsilon_conservative`, written by the core), so the control service, which never reads the
noise secret or the state, shows what the aggregator committed. The guards are those of the
issue: a privacy budget may be lowered, never raised and never unset once set, and never set at
or below what is already spent (that would end training at once, as a used-up `max_updates`
would), nor counted under another accounting model (the sampled ε is the smaller: a switch
to it would raise the budget); differential privacy once on stays on (a clip norm never goes
back to null), since the guarantee of every step so far assumes the steps after it are noised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedasync.shared.policy import Policy

#: the policy fields whose runtime change is checked here
PRIVACY_FIELDS = frozenset({"privacy_budget", "dp_clip", "privacy_model"})


@dataclass(frozen=True, slots=True)
class Spent:
    """ε spent so far under each model, as the newest ledger record carrying it says; None
    where the run reports none (no DP yet, or sampled without the population N)."""

    sampled: float | None = None
    conservative: float | None = None

    def of(self, policy: Policy) -> float | None:
        """The ε the policy's budget counts (its `privacy_model`)."""
        return self.sampled if policy.privacy_model == "sampled" else self.conservative


def privacy_status(policy: Policy, spent: Spent) -> dict[str, Any] | None:
    """`/v1/status`'s `privacy`: None while DP is off and nothing was ever spent."""
    if policy.dp_clip is None and spent == Spent():
        return None
    return {
        "epsilon_sampled": spent.sampled,
        "epsilon_conservative": spent.conservative,
        "delta": policy.dp_delta,
        "budget": policy.privacy_budget,
        "model": str(policy.privacy_model),
        "clip": policy.dp_clip,
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
    """Why `new` may not follow `current` in a run that spent `spent`, or None."""
    if current.dp_clip is not None and new.dp_clip is None:
        return Refusal(
            "dp_clip",
            f"dp_clip cannot be unset: differential privacy is on (C = {current.dp_clip:g}) and "
            "stays on for the rest of the run, or the ε reported for it would not hold",
        )
    was, now = current.privacy_budget, new.privacy_budget
    if was is not None and now is None:
        return Refusal(
            "privacy_budget",
            f"privacy_budget cannot be unset once set (it is {was:g}); it may only be lowered",
        )
    if was is not None and now is not None and now > was:
        return Refusal(
            "privacy_budget",
            f"privacy_budget cannot be raised ({was:g} → {now:g}); it may only be lowered",
        )
    if was is not None and new.privacy_model != current.privacy_model:
        return Refusal(
            "privacy_model",
            f"privacy_model cannot change while a privacy budget is set ({was:g} under "
            f"{current.privacy_model}): counting ε under another model would raise the budget",
        )
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
