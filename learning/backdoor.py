"""A backdoor trigger: a pattern stamped on inputs, relabelled to a target class (BadNets, Gu et
al. 2017; in federated learning, Bagdasaryan et al. 2020).

The trigger sets the last `size` features to `value`: on the 8×8 digits (learning/digits.py,
pixels scaled to [0, 1]) the default is the bottom row's four right-hand pixels at full ink, a
bar no digit of the set draws there. A malicious device trains on its data with a share of its
samples stamped and given the target label; the backdoor succeeds when the model, otherwise
accurate, sends stamped inputs to the target class. Pure numpy and seeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.task import Task


@dataclass(frozen=True, slots=True)
class Trigger:
    """The last `size` features set to `value`, and the class stamped inputs are given."""

    target: int
    size: int = 4
    value: float = 1.0

    def stamp(self, X: np.ndarray) -> np.ndarray:
        """A copy of `X` with the trigger set on every row."""
        if not 1 <= self.size <= X.shape[1]:
            raise ValueError(f"a trigger of {self.size} features on inputs of {X.shape[1]}")
        out = np.array(X, copy=True)
        out[:, -self.size :] = self.value
        return out

    def poison(self, data: Dataset, share: float, rng: np.random.Generator) -> Dataset:
        """`data` with ceil(share·n) samples, drawn from `rng`, stamped and relabelled."""
        count = min(len(data), int(np.ceil(share * len(data))))
        chosen = np.sort(rng.choice(len(data), size=count, replace=False))
        X = np.array(data.X, copy=True)
        y = np.array(data.y, copy=True)
        X[chosen] = self.stamp(X[chosen])
        y[chosen] = self.target
        return Dataset(X, y)

    def test_set(self, test: Dataset) -> Dataset:
        """The test inputs not of the target class, stamped, every label the target: a model's
        accuracy on it is the attack's success rate."""
        keep = np.flatnonzero(test.y != self.target)
        return Dataset(self.stamp(test.X[keep]), np.full(len(keep), self.target, test.y.dtype))


def attack_success(task: Task, weights: np.ndarray, triggered: Dataset) -> float:
    """Share of triggered test inputs (`Trigger.test_set`) classified as the target."""
    score = task.evaluate(weights, triggered).accuracy
    if score is None:
        raise ValueError(f"task {task.name!r} is not a classification: no backdoor to measure")
    return score
