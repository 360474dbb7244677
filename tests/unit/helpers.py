"""Small builders shared by the unit tests."""

from __future__ import annotations

import numpy as np

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.layout import Layout
from fedasync.shared.update import Update


def make_state(
    size: int = 4, value: float = 0.0, horizon: int = 1000, capacity: int = 10_000
) -> AggregationState:
    return AggregationState(
        np.full(size, value, np.float32),
        Layout.flat(size),
        dedup=DedupMemory(horizon=horizon, capacity=capacity),
    )


def make_update(
    update_id: str,
    base: int,
    value: float | np.ndarray = 1.0,
    *,
    size: int = 4,
    client: str = "c0",
    samples: int = 10,
) -> Update:
    weights = (
        np.asarray(value, np.float32)
        if isinstance(value, np.ndarray)
        else np.full(size, value, np.float32)
    )
    return Update(update_id, client, base, samples, weights)
