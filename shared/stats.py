"""Summary statistics of a run, one definition for the simulator, `fedasync up` and the control
service: percentiles of τ, α and latencies, and the rate at which updates were applied.

Pure: numbers in, numbers out. Written once here so that a figure called "p95" or "applied per
second" means the same in summary.json, the live view, the dashboard and the simulator's report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p95, max (None when there are no values)."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "max": None}
    array = np.asarray(values, dtype=np.float64)
    return {
        "count": len(values),
        "mean": float(np.mean(array)),
        "p50": float(np.percentile(array, 50)),
        "p95": float(np.percentile(array, 95)),
        "max": float(np.max(array)),
    }


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50, p95 and max, or None when there are no values (the dashboard's short form)."""
    if not values:
        return None
    array = np.asarray(values, dtype=np.float64)
    p50, p95 = np.percentile(array, [50, 95])
    return {"p50": float(p50), "p95": float(p95), "max": float(np.max(array))}


@dataclass(slots=True)
class AppliedRate:
    """Updates applied per second while training ran, fed one decision at a time.

    The definition: the intervals between the first and the last applied update (one fewer than
    the updates applied) divided by the seconds from the first applied update to the last. The
    start-up before the first one (services starting, devices loading and training their first
    update) and whatever follows the last one are left out, so the figure describes training,
    not how long the run took. `fedasync up`'s live view and its summary show this same figure.
    """

    applied: int = 0
    first_at: float | None = None
    last_at: float | None = None

    def add(self, at: float, outcome: str) -> None:
        """Take in one decision (`at`: when it was decided, seconds on any one clock)."""
        if outcome != "applied":
            return
        self.applied += 1
        if self.first_at is None:
            self.first_at = at
        self.last_at = at

    @property
    def per_second(self) -> float | None:
        """The rate, or None until two updates were applied at different instants."""
        if self.first_at is None or self.last_at is None or self.applied < 2:
            return None
        span = self.last_at - self.first_at
        return (self.applied - 1) / span if span > 0 else None
