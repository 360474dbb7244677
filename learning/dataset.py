"""A labelled sample set: the one shape of data every task, partitioner and device uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class Dataset:
    """Features `X` (n, d) and targets `y` (n,): class indices, or real values for regression."""

    X: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.X.ndim != 2 or self.y.ndim != 1 or len(self.X) != len(self.y):
            raise ValueError(f"X must be (n, d) and y (n,), got {self.X.shape} and {self.y.shape}")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray) -> Dataset:
        """The samples at `indices` (copies, so a device never shares memory with another)."""
        return Dataset(self.X[indices], self.y[indices])


def split(data: Dataset, test_share: float, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
    """Shuffle once with `rng` and cut into (train, test)."""
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must be in (0, 1), got {test_share}")
    order = rng.permutation(len(data))
    cut = len(data) - round(len(data) * test_share)
    return data.subset(order[:cut]), data.subset(order[cut:])
