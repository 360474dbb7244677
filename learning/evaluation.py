"""How well a model does on a data set: loss, accuracy and accuracy per class.

Per-class accuracy is what reveals a class that the aggregate hides (the write-up's rare class on
slow devices), so every classification task reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Scores of one model on one data set; `accuracy` is None for regression, `r2` otherwise."""

    loss: float
    num_samples: int
    accuracy: float | None = None
    per_class: dict[int, float] = field(default_factory=dict)
    r2: float | None = None

    @property
    def score(self) -> float:
        """Higher is better: accuracy for classification, R² for regression."""
        if self.accuracy is not None:
            return self.accuracy
        if self.r2 is not None:
            return self.r2
        raise ValueError("an evaluation needs an accuracy or an R²")


def classification(loss: float, predicted: np.ndarray, labels: np.ndarray) -> Evaluation:
    """Accuracy overall and for each class present in `labels`."""
    correct = predicted == labels
    per_class = {int(c): float(np.mean(correct[labels == c])) for c in np.unique(labels).tolist()}
    accuracy = float(np.mean(correct)) if len(labels) else 0.0
    return Evaluation(loss=loss, num_samples=len(labels), accuracy=accuracy, per_class=per_class)


def regression(predicted: np.ndarray, targets: np.ndarray) -> Evaluation:
    """Mean squared error as the loss, and R² (1 − SSE/SST) as the score."""
    residual = predicted - targets
    sse = float(np.sum(residual * residual))
    centred = targets - np.mean(targets)
    sst = float(np.sum(centred * centred))
    r2 = 1.0 - sse / sst if sst > 0 else 0.0
    return Evaluation(loss=sse / max(len(targets), 1), num_samples=len(targets), r2=r2)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of integer labels under softmax(logits), and the softmax itself."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    log_probs = shifted - np.log(exp.sum(axis=1, keepdims=True))
    loss = -float(np.mean(log_probs[np.arange(len(labels)), labels])) if len(labels) else 0.0
    return loss, probs
