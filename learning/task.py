"""What a learning task is: a model layout, its data, local training and evaluation.

The simulator and the device worker both train through this interface, so a run in simulation
and a run on a real device differ only in where the data and the time come from. Weights are
always one flat float32 vector in the task's `Layout`, the only form the core and the wire know.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.evaluation import Evaluation
from fedasync.shared.layout import Layout


@dataclass(frozen=True, slots=True)
class TrainParams:
    """Local training settings; each task suggests values that work for it."""

    epochs: int = 1
    lr: float = 0.05
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"epochs and batch_size must be >= 1 and lr > 0, got {self}")


class Task(ABC):
    """A model and its data. Subclasses implement the four operations below."""

    name: str
    layout: Layout
    #: number of classes; 0 for regression
    num_classes: int
    #: training settings that work for this task out of the box
    suggested: TrainParams

    @abstractmethod
    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """A fresh model as a flat float32 vector; the aggregator makes version 0 with it, so a
        task whose services run without torch computes it in numpy."""

    @abstractmethod
    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        """(train, test): generated or loaded from disk, never downloaded."""

    @abstractmethod
    def train(
        self,
        weights: np.ndarray,
        data: Dataset,
        rng: np.random.Generator,
        *,
        epochs: int,
        lr: float,
        batch_size: int,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """New weights after local SGD from `weights` (never modified), and local metrics."""

    @abstractmethod
    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        """Loss and scores of `weights` on `data`."""

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        """The mean loss gradient over `data` at `weights`, a flat float64 vector in the layout.

        Zeno++'s validation gradient (shared/zeno.py): the server scores updates against it, so
        it must be the same bits in every process (the simulator and the aggregator decide
        alike): numpy in float64, or torch on one thread. A task that cannot compute one keeps
        this default, and Zeno++ is refused for it with this error.
        """
        raise NoGradientError(
            f"task {self.name!r} does not compute loss gradients (Task.gradient), which "
            "Zeno++ (zeno_margin) needs"
        )

    def check_weights(self, weights: np.ndarray) -> None:
        """Refuse a vector that is not this task's model, before it is cut into tensors."""
        if weights.ndim != 1 or weights.size != self.layout.size:
            raise ValueError(
                f"{self.name}: expected {self.layout.size} weights, got shape {weights.shape}"
            )


class NoGradientError(NotImplementedError):
    """The task does not implement `Task.gradient`."""


def batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of shuffled minibatch indices; the last batch may be short."""
    order = rng.permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]
