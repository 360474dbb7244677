"""The whole task: a small CNN that tells four kinds of stripes apart, on images it draws itself.

fedasync needs three things from a task, and `TorchTask` turns them into its `Task` interface:
a fresh model (`model`), the data (`dataset`, here generated, so nothing is downloaded) and, for
anything but plain classification, a loss. Name it `custom_model.task:make` wherever fedasync
names a task (`fedasync simulate`, `fedasync up --task`, `FEDASYNC_TASK__NAME`).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from fedasync import Dataset, TorchTask, TrainParams

SIDE = 12  # images are SIDE × SIDE, one channel
KINDS = ("horizontal", "vertical", "diagonal", "anti-diagonal")


def draw(kind: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Stripes of each image's kind, at a random period and phase, in noise: (n, SIDE * SIDE)."""
    rows, cols = np.mgrid[0:SIDE, 0:SIDE]
    position = np.stack([rows, cols, rows + cols, rows - cols])[kind]  # (n, SIDE, SIDE)
    period = rng.integers(3, 6, size=(len(kind), 1, 1))
    phase = rng.integers(0, 6, size=(len(kind), 1, 1))
    stripes = ((position + phase) % period == 0).astype(np.float32)
    noisy = stripes + rng.normal(scale=0.9, size=stripes.shape)
    return noisy.reshape(len(kind), SIDE * SIDE).astype(np.float32)


class Stripes(TorchTask):
    """Conv(8) + BatchNorm → pool → Conv(16) → global average → 4 classes (about 1,300 weights)."""

    def __init__(self, samples: int = 2400, test_share: float = 0.2) -> None:
        self.samples, self.test_share = samples, test_share
        # buffers=True: BatchNorm's running statistics travel with the weights and are averaged
        super().__init__(
            name="stripes",
            num_classes=len(KINDS),
            buffers=True,
            suggested=TrainParams(epochs=2, lr=0.05, batch_size=16),
        )

    def model(self) -> nn.Module:
        return nn.Sequential(
            nn.Unflatten(1, (1, SIDE, SIDE)),  # rows of the data set are flat images
            nn.Conv2d(1, 8, kernel_size=3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, len(KINDS)),
        )

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        kind = rng.integers(0, len(KINDS), size=self.samples)
        images = draw(kind, rng)
        cut = int(self.samples * (1 - self.test_share))
        return Dataset(images[:cut], kind[:cut]), Dataset(images[cut:], kind[cut:])


def make(samples: int = 2400) -> Stripes:
    """What fedasync calls (with the task's params as keyword arguments)."""
    return Stripes(samples=samples)
