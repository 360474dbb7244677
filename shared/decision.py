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
    `AggregationState.norm_bound`), after clipping; `clipped` says the poisoning bound scaled it
    down. Records written before the bound existed lack both and read back as None and False.
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

    @property
    def applied(self) -> bool:
        return self.outcome is Outcome.APPLIED

    def to_dict(self) -> dict[str, Any]:
        """Plain msgpack/JSON-safe form (written once per decision: no deep copy)."""
        out = {f.name: getattr(self, f.name) for f in _FIELDS}
        out["outcome"] = self.outcome.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        values = dict(data)
        values["outcome"] = Outcome(values["outcome"])
        return cls(**values)


_FIELDS = fields(Decision)
