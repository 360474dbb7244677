"""A task written outside fedasync, as a user writes one, with only the public API.

Softmax regression on Gaussian clouds, one per class: numpy only, learnt in a few updates. The tests
copy this file into a temporary folder, put that folder on sys.path or PYTHONPATH, and name it
`mytask:make` or `mytask:Blobs`; it is never imported from here. The objects after `make` are
wrong on purpose, one for each way an import path can fail to name a task.
"""

from __future__ import annotations

import numpy as np

from fedasync import Dataset, Evaluation, Layout, Task, TrainParams


class Blobs(Task):
    """`classes` Gaussian clouds in `dim` dimensions; chance accuracy is 1 / classes."""

    def __init__(self, classes: int = 3, dim: int = 4, samples: int = 600) -> None:
        if classes < 2 or dim < 1 or samples < 10 * classes:
            raise ValueError("classes must be >= 2, dim >= 1 and samples >= 10 per class")
        self.name = "blobs"
        self.dim, self.samples = dim, samples
        self.num_classes = classes
        self.layout = Layout.of([("weight", (classes, dim)), ("bias", (classes,))])
        self.suggested = TrainParams(epochs=1, lr=0.5, batch_size=32)

    @classmethod
    def small(cls) -> Blobs:
        """Reached as `mytask:Blobs.small` (a dotted attribute)."""
        return cls(classes=2, dim=2, samples=100)

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.layout.size, np.float32)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        centres = rng.normal(scale=2.0, size=(self.num_classes, self.dim))
        y = rng.integers(0, self.num_classes, size=self.samples)
        X = (centres[y] + rng.normal(size=(self.samples, self.dim))).astype(np.float32)
        cut = self.samples * 4 // 5
        return Dataset(X[:cut], y[:cut]), Dataset(X[cut:], y[cut:])

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
        flat = np.array(weights, dtype=np.float64)  # a copy: the snapshot is never touched
        parts = self.layout.split(flat)  # views into `flat`
        losses: list[float] = []
        for _ in range(epochs):
            order = rng.permutation(len(data))
            for start in range(0, len(data), batch_size):
                batch = order[start : start + batch_size]
                X, y = data.X[batch], data.y[batch]
                probs = _softmax(X @ parts["weight"].T + parts["bias"])
                losses.append(float(-np.mean(np.log(probs[np.arange(len(y)), y] + 1e-12))))
                probs[np.arange(len(y)), y] -= 1.0
                grad = probs / len(y)
                parts["weight"] -= lr * grad.T @ X
                parts["bias"] -= lr * grad.sum(axis=0)
        loss = float(np.mean(losses)) if losses else 0.0
        return flat.astype(np.float32), {"loss": loss, "num_samples": float(len(data))}

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        self.check_weights(weights)
        parts = self.layout.split(np.asarray(weights, dtype=np.float64))
        probs = _softmax(data.X @ parts["weight"].T + parts["bias"])
        loss = float(-np.mean(np.log(probs[np.arange(len(data)), data.y] + 1e-12)))
        correct = np.argmax(probs, axis=1) == data.y
        per_class = {int(c): float(np.mean(correct[data.y == c])) for c in np.unique(data.y)}
        return Evaluation(
            loss=loss,
            num_samples=len(data),
            accuracy=float(np.mean(correct)),
            per_class=per_class,
        )


def make(classes: int = 3, dim: int = 4, samples: int = 600) -> Blobs:
    """The factory a config names: `[task] name = "mytask:make"`, `params = {classes = 4}`."""
    return Blobs(classes=classes, dim=dim, samples=samples)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True))


# ------------------------------------------------------------- wrong on purpose, one per error
NOT_A_TASK = 42
INSTANCE = Blobs()


class NotATask:
    """A class, but not a Task subclass."""


class Incomplete(Task):
    """A Task subclass that implements nothing."""


def returns_a_string() -> str:
    return "digits"


def broken() -> Task:
    raise RuntimeError("no data here")


class DataFails(Blobs):
    """Builds, but its data cannot be made: what a param of the right name and the wrong type
    does to a real task (`{"samples": "x"}` reaching numpy)."""

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        raise TypeError("ufunc 'multiply' did not contain a loop with signature matching types")


def main() -> None:
    """A script's entry point named by mistake: its argument parser exits."""
    raise SystemExit(2)


def no_layout() -> Task:
    task = Blobs()
    del task.layout
    return task


class TrainFails(Blobs):
    """Its train fails inside numpy, a few frames below its own line (a shape mistake)."""

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
        return np.reshape(weights, (7, -1, 5)), {}  # TRAIN FAILS HERE
