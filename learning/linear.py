"""The write-up's synthetic linear regression: y = X·w* + noise, trained with minibatch SGD.

Pure numpy and tiny, so it is the task for checking the simulator's arithmetic and speed.
"""

from __future__ import annotations

import numpy as np

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.evaluation import Evaluation, regression
from fedasync.learning.task import Task, TrainParams, batches
from fedasync.shared.layout import Layout


class LinearRegression(Task):
    """`dim` features, no bias, Gaussian inputs and noise (section 3.4 of the write-up)."""

    def __init__(
        self, dim: int = 20, samples: int = 6000, noise: float = 0.1, test_share: float = 0.2
    ) -> None:
        if dim < 1 or samples < 2 or noise < 0:
            raise ValueError("dim >= 1, samples >= 2 and noise >= 0 are required")
        self.name = "linear"
        self.dim = dim
        self.samples = samples
        self.noise = noise
        self.test_share = test_share
        self.layout = Layout.flat(dim, "w")
        self.num_classes = 0
        self.suggested = TrainParams(epochs=5, lr=0.05, batch_size=32)

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """Zeros, as in the write-up; `rng` is accepted for a uniform interface."""
        return np.zeros(self.dim, np.float32)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        true_w = rng.normal(size=self.dim)
        X = rng.normal(size=(self.samples, self.dim))
        y = X @ true_w + rng.normal(scale=self.noise, size=self.samples)
        return split(Dataset(X, y), self.test_share, rng)

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
        self.check_weights(weights)
        w = np.array(weights, dtype=np.float64)  # a private copy: the input is never touched
        losses: list[float] = []
        for _ in range(epochs):
            losses.clear()
            for batch in batches(len(data), batch_size, rng):
                xb, yb = data.X[batch], data.y[batch]
                residual = xb @ w - yb
                losses.append(float(np.mean(residual * residual)))
                w -= lr * (xb.T @ residual) / len(batch)
        loss = float(np.mean(losses)) if losses else 0.0
        return w.astype(np.float32), {"loss": loss, "num_samples": float(len(data))}

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        """∇ of the mean squared error (the evaluation's loss): 2·Xᵀ(Xw − y)/n."""
        self.check_weights(weights)
        X = np.asarray(data.X, np.float64)
        residual = X @ weights.astype(np.float64) - data.y
        grad: np.ndarray = 2.0 * (X.T @ residual) / max(len(data), 1)
        return grad

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        self.check_weights(weights)
        return regression(data.X @ weights.astype(np.float64), data.y)
