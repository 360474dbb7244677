"""`Task.gradient`, Zeno++'s validation gradient: the gradient of the evaluation's loss, the same
bits on every call, and a typed refusal for a task that has none."""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.learning.dataset import Dataset
from fedasync.learning.digits import DigitsMLP
from fedasync.learning.linear import LinearRegression
from fedasync.learning.synthetic import SyntheticClassification
from fedasync.learning.task import NoGradientError, Task
from fedasync.learning.task_failure import guarded
from fedasync.learning.torch_task import TorchTask


def _central_differences(task: Task, weights: np.ndarray, data: Dataset) -> np.ndarray:
    w = weights.astype(np.float64)
    out = np.empty_like(w)
    h = 1e-6
    for i in range(w.size):
        up, down = w.copy(), w.copy()
        up[i] += h
        down[i] -= h
        out[i] = (task.evaluate(up, data).loss - task.evaluate(down, data).loss) / (2 * h)
    return out


@pytest.mark.parametrize(
    "task",
    [LinearRegression(dim=6, samples=200), SyntheticClassification(dim=5, classes=3, samples=90)],
    ids=["linear", "synthetic"],
)
def test_the_gradient_is_the_evaluation_losss_gradient(task: Task) -> None:
    rng = np.random.default_rng(0)
    _, held_out = task.dataset(rng)
    weights = rng.normal(0.0, 0.3, task.layout.size).astype(np.float32)
    gradient = task.gradient(weights, held_out)
    assert gradient.dtype == np.float64
    assert gradient.shape == (task.layout.size,)
    np.testing.assert_allclose(
        gradient, _central_differences(task, weights, held_out), rtol=1e-5, atol=1e-7
    )


def test_the_digits_numpy_gradient_is_torchs_autograd_of_the_same_mlp() -> None:
    pytest.importorskip("torch")
    task = DigitsMLP(hidden=8)
    _, held_out = task.dataset(np.random.default_rng(0))
    weights = task.init_weights(np.random.default_rng(1))
    numpy_gradient = task.gradient(weights, held_out)
    torch_gradient = TorchTask.gradient(task, weights, held_out)
    np.testing.assert_allclose(numpy_gradient, torch_gradient, rtol=1e-4, atol=1e-6)


def test_the_gradient_is_the_same_bits_on_every_call() -> None:
    task = DigitsMLP(hidden=8)
    _, held_out = task.dataset(np.random.default_rng(0))
    weights = task.init_weights(np.random.default_rng(1))
    first = task.gradient(weights, held_out)
    assert first.tobytes() == task.gradient(weights.copy(), held_out).tobytes()


def test_a_task_without_a_gradient_raises_the_typed_error_through_the_guard() -> None:
    class NoGradient(LinearRegression):
        gradient = Task.gradient

    task = guarded(NoGradient(dim=2, samples=10), "no-gradient")
    _, data = task.dataset(np.random.default_rng(0))
    with pytest.raises(NoGradientError, match="Zeno"):
        task.gradient(np.zeros(2, np.float32), data)
