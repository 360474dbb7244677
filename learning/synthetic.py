"""Synthetic(α, β) classification in the style of LEAF (Caldas et al. 2018), numpy softmax model.

Samples come from `groups` sources. Source k draws u_k ~ N(0, α) and its own model
W_k, b_k ~ N(u_k, 1), and inputs x ~ N(v_k, Σ) with v_k ~ N(B_k, 1), B_k ~ N(0, β) and
Σ = diag(j^−1.2); its labels are argmax(W_k·x + b_k). α controls how much the sources' models
differ, β how much their inputs differ; α = β = 0 still gives each source its own model, as in
LEAF. One global softmax regression is trained on the pooled data.
"""

from __future__ import annotations

import numpy as np

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.evaluation import Evaluation, classification, cross_entropy
from fedasync.learning.task import Task, TrainParams, batches
from fedasync.shared.layout import Layout


class SyntheticClassification(Task):
    """LEAF's Synthetic(α, β) data, `dim` features, `classes` labels, a softmax regression."""

    def __init__(
        self,
        alpha: float = 0.5,
        beta: float = 0.5,
        dim: int = 60,
        classes: int = 10,
        groups: int = 30,
        samples: int = 6000,
        test_share: float = 0.2,
    ) -> None:
        if alpha < 0 or beta < 0 or dim < 1 or classes < 2 or groups < 1 or samples < groups:
            raise ValueError("need alpha, beta >= 0, dim >= 1, classes >= 2, samples >= groups")
        self.name = "synthetic"
        self.alpha, self.beta = alpha, beta
        self.dim, self.groups, self.samples = dim, groups, samples
        self.test_share = test_share
        self.num_classes = classes
        self.layout = Layout.of([("W", (dim, classes)), ("b", (classes,))])
        self.suggested = TrainParams(epochs=2, lr=0.05, batch_size=32)

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """Zeros: the softmax regression is convex, any start will do."""
        return np.zeros(self.layout.size, np.float32)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        cov = np.arange(1, self.dim + 1, dtype=np.float64) ** -1.2
        sizes = np.full(self.groups, self.samples // self.groups)
        sizes[: self.samples % self.groups] += 1
        xs, ys = [], []
        for size in sizes.tolist():
            u = rng.normal(0.0, np.sqrt(self.alpha))
            W = rng.normal(u, 1.0, size=(self.dim, self.num_classes))
            b = rng.normal(u, 1.0, size=self.num_classes)
            v = rng.normal(rng.normal(0.0, np.sqrt(self.beta)), 1.0, size=self.dim)
            X = rng.normal(v, np.sqrt(cov), size=(size, self.dim))
            xs.append(X)
            ys.append(np.argmax(X @ W + b, axis=1))
        return split(Dataset(np.concatenate(xs), np.concatenate(ys)), self.test_share, rng)

    def _parts(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = self.layout.split(flat)
        return parts["W"], parts["b"]

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
        flat = np.array(weights, dtype=np.float64)  # a private copy: the input is never touched
        W, b = self._parts(flat)  # views into the copy
        onehot = np.eye(self.num_classes)[data.y]
        losses: list[float] = []
        for _ in range(epochs):
            losses.clear()
            for batch in batches(len(data), batch_size, rng):
                xb = data.X[batch]
                loss, probs = cross_entropy(xb @ W + b, data.y[batch])
                losses.append(loss)
                grad = (probs - onehot[batch]) / len(batch)
                W -= lr * (xb.T @ grad)
                b -= lr * grad.sum(axis=0)
        loss = float(np.mean(losses)) if losses else 0.0
        return flat.astype(np.float32), {"loss": loss, "num_samples": float(len(data))}

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        """∇ of the mean cross-entropy: Xᵀ(p − onehot)/n for W, the column sums for b."""
        self.check_weights(weights)
        W, b = self._parts(weights.astype(np.float64))
        X = np.asarray(data.X, np.float64)
        _, probs = cross_entropy(X @ W + b, data.y)
        diff = (probs - np.eye(self.num_classes)[data.y]) / max(len(data), 1)
        return np.concatenate([(X.T @ diff).ravel(), diff.sum(axis=0)])

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        self.check_weights(weights)
        W, b = self._parts(weights.astype(np.float64))
        logits = data.X @ W + b
        loss, _ = cross_entropy(logits, data.y)
        return classification(loss, np.argmax(logits, axis=1), data.y)
