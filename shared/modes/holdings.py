"""What the modes keep between server steps, as plain data on the aggregation state.

Each holding is an attribute of `AggregationState` under the name its mode's strategy declares
(`Strategy.holding`) and a section of the same name in a checkpoint (shared/checkpoint.py):
`buffer` (fedbuff and fedbuff-fair), `memory` (memory) and `tiers` (tiered). FedAsync holds
nothing: every update is a server step. The client book (shared/clients.py) is not a holding:
memory, tiered and fedbuff-fair all read it, and it outlives a mode switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedasync.shared.robust import Kept, RuleSpec


@dataclass(slots=True)
class FedBuffBuffer:
    """Σ w_i·s(τ_i)·Δ_i over the updates buffered since the last server step, in float64, and
    Σ w_i (K in FedBuff, where every w_i is 1; the inverse-rate weights in fedbuff-fair)."""

    total: np.ndarray
    count: int = 0
    weight: float = 0.0
    #: the robust rule the buffer is gathered under (policy `robust`, shared/robust.py), set by
    #: its first update; None under the mean, which needs nothing but the sums above
    rule: RuleSpec | None = None
    #: under a robust rule: every buffered update (id, w_i, w_i·s(τ_i)·Δ_i), in order
    kept: list[Kept] = field(default_factory=list)


@dataclass(slots=True)
class Memory:
    """Memory mode: S = Σ n_i·m_i over the deltas the client book holds (float64), W = Σ n_i,
    and the updates remembered since the last server step."""

    total: np.ndarray
    weight: int = 0
    pending: int = 0


@dataclass(slots=True, eq=False)
class Tier:
    """Tiered mode: one latency tier's round in progress and its latest completed model."""

    #: Σ n_i·x_i over the round's updates so far, float64
    total: np.ndarray
    #: Σ n_i over them
    weight: int = 0
    #: updates in the round so far (a round completes at K)
    count: int = 0
    #: rounds completed (FedAT's T_m)
    rounds: int = 0
    #: the model of its latest completed round, float32; None before its first
    model: np.ndarray | None = None
