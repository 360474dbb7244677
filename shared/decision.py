"""What the aggregator did with an update: the record the ledger keeps for each one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    APPLIED = "applied"
    DROPPED = "dropped"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


class DropReason(StrEnum):
    """Why a valid update was not used."""

    #: τ > τ_max under the policy in force
    STALE = "stale"
    #: FedBuff needs the weights of the base version to form a delta and they are no longer kept
    BASE_UNAVAILABLE = "base_unavailable"
    #: older than the dedup horizon: may have been decided before, and is stale under any policy
    BEYOND_DEDUP_HORIZON = "beyond_dedup_horizon"
    #: training is over (a budget was reached): the model no longer changes
    CLOSED = "closed"
    #: differential privacy: its device has made `dp_participation` contributions already
    PARTICIPATION_CAP = "participation_cap"


class RejectReason(StrEnum):
    """Why an update was invalid. The wire codec has its own reasons for undecodable bytes."""

    SHAPE_MISMATCH = "shape_mismatch"
    BAD_DTYPE = "bad_dtype"
    NON_FINITE = "non_finite"
    BAD_BASE_VERSION = "bad_base_version"
    FUTURE_BASE_VERSION = "future_base_version"
    BAD_NUM_SAMPLES = "bad_num_samples"
    BAD_ID = "bad_id"
    #: its delta norm exceeds the poisoning bound (policy `norm_bound`, `norm_action = reject`)
    NORM_BOUND = "norm_bound"
    #: its Zeno++ descent score on the server's held-out set is below −γε (policy `zeno_margin`)
    ZENO = "zeno"


@dataclass(frozen=True, slots=True)
class Decision:
    """One terminal decision about one update.

    `version` is the model version after the decision; versions count server steps, so it is one
    higher exactly when `server_step` (every applied FedAsync update; the K-th of a FedBuff buffer,
    whose other applied updates record the version in force and are part of the next one). `alpha`
    is the effective mixing weight: α0·s(τ) in FedAsync, server_lr·s(τ)/K in FedBuff.
    `delta_norm` is how far the update would move the model before α (see
    `AggregationState.norm_bound`), after clipping; `clipped` says the poisoning bound (or, with
    differential privacy, the clip C) scaled it down. Records written before the bound existed
    lack both and read back as None and False.
    `epsilon_sampled` and `epsilon_conservative` are the privacy spent after this decision
    under the two models of shared/privacy/accounting.py, when DP is on; `adaptive_clip` is the
    clip C in force after it when C adapts (policy `dp_quantile`, Andrew et al. 2021), so that
    a reader of the ledger sees the C updates are clipped to now, not only the `dp_clip` it
    started from. `excluded` names the buffered updates a robust rule (policy `robust`,
    shared/robust.py) left out of the server step this decision takes, with the rule's account
    in `detail`. `partial` names the partial aggregate of a tree's leaf that took the update in.

    Fields added since the ledgers began (`QUIET`) are left out of `to_dict()` at their
    default, so that a run not using them records the bytes it always has.
    """

    outcome: Outcome
    update_id: str
    client_id: str
    base_version: int
    version: int
    policy_version: int
    tau: int | None = None
    alpha: float | None = None
    step_norm: float | None = None
    server_step: bool = False
    reason: str | None = None
    detail: str = ""
    delta_norm: float | None = None
    clipped: bool = False
    excluded: tuple[str, ...] = ()
    epsilon_sampled: float | None = None
    epsilon_conservative: float | None = None
    adaptive_clip: float | None = None
    #: hierarchical FedBuff (shared/tree.py): the leaf's partial aggregate that took this update
    #: in (`<shard>-<seq>`); the root's commit of that partial names the server step
    partial: str | None = None

    @property
    def applied(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def to_dict(self) -> dict[str, Any]:
        """Plain msgpack/JSON-safe form (written once per decision: no deep copy)."""
        out = {f.name: getattr(self, f.name) for f in _FIELDS}
        for name in QUIET:
            if out[name] is None or out[name] == ():  # at its default
                del out[name]
        out["outcome"] = self.outcome.value
        if self.excluded:
            out["excluded"] = list(self.excluded)  # as msgpack and JSON read it back
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        values = dict(data)
        values["outcome"] = Outcome(values["outcome"])
        values["excluded"] = tuple(str(i) for i in values.get("excluded", ()))
        return cls(**values)


_FIELDS = fields(Decision)
#: fields left out of `Decision.to_dict()` at their default (None, or nothing excluded)
QUIET = ("excluded", "epsilon_sampled", "epsilon_conservative", "adaptive_clip", "partial")
