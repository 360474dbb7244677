"""scikit-learn's bundled 8×8 digits (1,797 images, 10 classes) and a one-hidden-layer MLP.

A `TorchTask`: the model is a torch module (learning/digits_net.py), trained by TorchTask's
plain SGD with cross-entropy, as on a device. The layout, the initial weights and the evaluation
are numpy only, overriding TorchTask's torch defaults: the aggregator creates the first model and
the evaluator scores versions without torch installed. Importing this module never imports torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.evaluation import Evaluation, classification, cross_entropy
from fedasync.learning.task import TrainParams
from fedasync.learning.torch_task import TorchTask
from fedasync.shared.layout import Layout

if TYPE_CHECKING:
    from torch import nn

FEATURES = 64
CLASSES = 10


class DigitsMLP(TorchTask):
    """64 → `hidden` (ReLU) → 10; its layout is the module's, written out so torch is not needed."""

    def __init__(self, hidden: int = 32, test_share: float = 0.2) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.hidden = hidden
        self.test_share = test_share
        super().__init__(
            name="digits",
            num_classes=CLASSES,
            buffers=False,  # the MLP has none
            suggested=TrainParams(epochs=2, lr=0.1, batch_size=16),
            layout=Layout.of(
                [
                    ("hidden.weight", (hidden, FEATURES)),
                    ("hidden.bias", (hidden,)),
                    ("out.weight", (CLASSES, hidden)),
                    ("out.bias", (CLASSES,)),
                ]
            ),
        )

    def model(self) -> nn.Module:
        from fedasync.learning.digits_net import MLP

        return MLP(FEATURES, self.hidden, CLASSES)

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """nn.Linear's default bounds, in numpy: weights and biases U(−1/√fan_in, 1/√fan_in)."""
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

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        """The module's forward pass in numpy (float32), so scoring a model needs no torch."""
        self.check_weights(weights)
        parts = self.layout.split(np.asarray(weights, dtype=np.float32))
        hidden = np.maximum(data.X @ parts["hidden.weight"].T + parts["hidden.bias"], 0.0)
        logits = (hidden @ parts["out.weight"].T + parts["out.bias"]).astype(np.float64)
        loss, _ = cross_entropy(logits, data.y)
        return classification(loss, np.argmax(logits, axis=1), data.y)

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        """∇ of the mean cross-entropy by backpropagation in numpy (float64), so the aggregator
        computes Zeno++'s validation gradient without torch; the same as TorchTask's autograd
        on the MLP (tests/learning)."""
        self.check_weights(weights)
        parts = self.layout.split(np.asarray(weights, dtype=np.float64))
        X = np.asarray(data.X, np.float64)
        w1, b1, w2, b2 = (
            parts[n] for n in ("hidden.weight", "hidden.bias", "out.weight", "out.bias")
        )
        pre = X @ w1.T + b1
        hidden = np.maximum(pre, 0.0)
        _, probs = cross_entropy(hidden @ w2.T + b2, data.y)
        d_logits = (probs - np.eye(CLASSES)[data.y]) / max(len(data), 1)
        d_pre = (d_logits @ w2) * (pre > 0)
        return np.concatenate(
            [
                (d_pre.T @ X).ravel(),
                d_pre.sum(axis=0),
                (d_logits.T @ hidden).ravel(),
                d_logits.sum(axis=0),
            ]
        )
