"""What makes an update invalid, whoever decides it: one set of checks and one wording.

`AggregationState.apply` (FedAsync, FedBuff and the other asynchronous modes) and the
simulator's synchronous FedAvg both refuse an update with these reasons and details, so a task
whose `train` returns the wrong thing is refused the same way by every algorithm, before any of
them averages it, instead of being folded into one and crashing another.
"""

from __future__ import annotations

import numpy as np

from fedasync.shared.decision import RejectReason
from fedasync.shared.update import Update

#: the weight dtypes an update may carry (float16 is widened to float32 on arrival)
ACCEPTED_DTYPES = (np.dtype("<f4"), np.dtype("<f2"))
#: the detail of a non-finite refusal, wherever it is found
NON_FINITE_DETAIL = "weights contain NaN or Inf"

Problem = tuple[RejectReason, str]


def is_count(value: object) -> bool:
    """A non-negative int (a bool is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def update_problem(update: Update, version: int, size: int) -> Problem | None:
    """Why `update` cannot be decided against model `version` of `size` parameters, or None.

    Checks the base version, the sample count, the weights' dtype and shape: nothing that reads
    a weight's value, so a caller may run it on every update. Finiteness reads every value and is
    `finite_problem`, which the core folds into its mixing pass.
    """
    if not is_count(update.base_version):
        return RejectReason.BAD_BASE_VERSION, f"base version {update.base_version!r}"
    if update.base_version > version:
        return (
            RejectReason.FUTURE_BASE_VERSION,
            f"base version {update.base_version} > model version {version}",
        )
    if not is_count(update.num_samples) or update.num_samples < 1:
        return RejectReason.BAD_NUM_SAMPLES, f"num_samples {update.num_samples!r} < 1"
    w = update.weights
    if not isinstance(w, np.ndarray) or w.dtype not in ACCEPTED_DTYPES:
        dtype = getattr(w, "dtype", type(w).__name__)
        return RejectReason.BAD_DTYPE, f"dtype {dtype}, expected float32 or float16"
    if w.ndim != 1 or w.size != size:
        return RejectReason.SHAPE_MISMATCH, f"shape {w.shape}, expected ({size},)"
    return None


def finite_problem(weights: np.ndarray) -> Problem | None:
    """NON_FINITE when any weight is NaN or ±Inf (weights already past `update_problem`)."""
    if not np.isfinite(weights).all():
        return RejectReason.NON_FINITE, NON_FINITE_DETAIL
    return None
