"""Small torch models and a TorchTask for the adapter's tests (importable by a child process).

`python -m tests.learning.torch_models SEED` prints the digest of one seeded initialisation and
training run, so a test can compare it with the same run in its own process.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch
from torch import nn

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.task import TrainParams
from fedasync.torch import TorchTask

SIDE = 8
CLASSES = 4


class SmallCNN(nn.Module):
    """Conv → BatchNorm → ReLU → Dropout → Linear over 8×8 single-channel images given as rows."""

    def __init__(self, channels: int = 4, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, kernel_size=3, padding=1)
        self.norm = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(channels * SIDE * SIDE, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x.view(-1, 1, SIDE, SIDE))))
        out: torch.Tensor = self.head(self.drop(h).flatten(1))
        return out


class QuadrantTask(TorchTask):
    """Random 8×8 images labelled by their brightest quadrant: learnable, generated, 4 classes."""

    def __init__(self, channels: int = 4, samples: int = 400, buffers: bool = True) -> None:
        self.channels = channels
        self.samples = samples
        super().__init__(
            name="quadrant",
            num_classes=CLASSES,
            buffers=buffers,
            suggested=TrainParams(epochs=2, lr=0.05, batch_size=16),
        )

    def model(self) -> nn.Module:
        return SmallCNN(self.channels)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        images = rng.random((self.samples, SIDE, SIDE)).astype(np.float32)
        half = SIDE // 2
        sums = [
            images[:, :half, :half],
            images[:, :half, half:],
            images[:, half:, :half],
            images[:, half:, half:],
        ]
        y = np.argmax(np.stack([q.sum(axis=(1, 2)) for q in sums], axis=1), axis=1)
        return split(Dataset(images.reshape(self.samples, -1), y.astype(np.int64)), 0.25, rng)


def digest(seed: int) -> str:
    """Initial weights and two training runs from one seed, as a hash of their bytes."""
    task = QuadrantTask()
    train, _ = task.dataset(np.random.default_rng(seed))
    weights = task.init_weights(np.random.default_rng(seed + 1))
    run_rng = np.random.default_rng(seed + 2)
    h = hashlib.sha256(weights.tobytes())
    for _ in range(2):
        weights, metrics = task.train(weights, train, run_rng, epochs=1, lr=0.05, batch_size=16)
        h.update(weights.tobytes())
        h.update(repr(metrics["loss"]).encode())
    return h.hexdigest()


if __name__ == "__main__":
    print(digest(int(sys.argv[1])))
