"""scikit-learn's bundled 8×8 digits (1,797 images, 10 classes) and a one-hidden-layer MLP.

Training runs in torch (as on a device). The initial weights and the evaluation are numpy only:
the aggregator creates the first model and the evaluator scores versions without torch
installed. torch is imported inside `train`, so importing this module never needs it.
"""

from __future__ import annotations

import math

import numpy as np

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.evaluation import Evaluation, classification, cross_entropy
from fedasync.learning.task import Task, TrainParams, batches
from fedasync.shared.layout import Layout

FEATURES = 64
CLASSES = 10


class DigitsMLP(Task):
    """64 → `hidden` (ReLU) → 10, tensors named as torch's state_dict would name them."""

    def __init__(self, hidden: int = 32, test_share: float = 0.2) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.name = "digits"
        self.hidden = hidden
        self.test_share = test_share
        self.num_classes = CLASSES
        self.layout = Layout.of(
            [
                ("hidden.weight", (hidden, FEATURES)),
                ("hidden.bias", (hidden,)),
                ("out.weight", (CLASSES, hidden)),
                ("out.bias", (CLASSES,)),
            ]
        )
        self.suggested = TrainParams(epochs=2, lr=0.1, batch_size=16)

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """torch.nn.Linear's default: weights and biases U(−1/√fan_in, 1/√fan_in)."""
        parts = []
        for name, shape in self.layout.tensors:
            fan_in = FEATURES if name.startswith("hidden") else self.hidden
            bound = 1.0 / math.sqrt(fan_in)
            parts.append(rng.uniform(-bound, bound, size=shape).ravel())
        return np.concatenate(parts).astype(np.float32)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]  # bundled

        bunch = load_digits()
        X = np.asarray(bunch.data, dtype=np.float32) / 16.0
        y = np.asarray(bunch.target, dtype=np.int64)
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
        """Plain minibatch SGD; shuffling comes from `rng`, so torch draws nothing random."""
        import torch

        torch.set_num_threads(1)  # deterministic sums and no thread start-up per tiny batch
        self.check_weights(weights)
        params = [
            torch.tensor(np.array(part, dtype=np.float32), requires_grad=True)  # copies
            for part in self.layout.split(weights).values()
        ]
        w1, b1, w2, b2 = params
        X = torch.from_numpy(np.ascontiguousarray(data.X, dtype=np.float32))
        y = torch.from_numpy(np.ascontiguousarray(data.y, dtype=np.int64))
        losses: list[float] = []
        for _ in range(epochs):
            losses.clear()
            for batch in batches(len(data), batch_size, rng):
                index = torch.from_numpy(batch)
                hidden = torch.relu(X[index] @ w1.T + b1)
                loss = torch.nn.functional.cross_entropy(hidden @ w2.T + b2, y[index])
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for param, grad in zip(params, grads, strict=True):
                        param.sub_(lr * grad)
                losses.append(float(loss.item()))
        flat = np.concatenate([p.detach().numpy().ravel() for p in params]).astype(np.float32)
        loss_mean = float(np.mean(losses)) if losses else 0.0
        return flat, {"loss": loss_mean, "num_samples": float(len(data))}

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        """The same forward pass in numpy (float32), so scoring a model needs no torch."""
        self.check_weights(weights)
        parts = self.layout.split(np.asarray(weights, dtype=np.float32))
        hidden = np.maximum(data.X @ parts["hidden.weight"].T + parts["hidden.bias"], 0.0)
        logits = (hidden @ parts["out.weight"].T + parts["out.bias"]).astype(np.float64)
        loss, _ = cross_entropy(logits, data.y)
        return classification(loss, np.argmax(logits, axis=1), data.y)
