"""The server's held-out set: a few training samples it keeps to score updates (Zeno++).

One rule for the simulator and the aggregator, so that both hold the same samples and compute
the same validation gradient: `samples` rows of the task's training split, drawn without
replacement from the run seed's own stream (shared/seeds.py, `Stream.VALIDATION`), in index
order. The devices may hold them too: Zeno++ asks for data from the training distribution,
not for data no device has.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.task import Task
from fedasync.shared.seeds import Stream, stream


def held_out(train: Dataset, samples: int, seed: int) -> Dataset:
    """min(samples, n) rows of `train`, the same for the same seed in every process."""
    count = min(samples, len(train))
    chosen = stream(seed, Stream.VALIDATION).choice(len(train), count, replace=False)
    return train.subset(np.sort(chosen))


def gradient_source(task: Task, data: Dataset) -> Callable[[np.ndarray], np.ndarray]:
    """weights ↦ the mean loss gradient on `data`: what `AggregationState.zeno_prepare` calls."""

    def gradient_at(weights: np.ndarray) -> np.ndarray:
        return task.gradient(weights, data)

    return gradient_at
