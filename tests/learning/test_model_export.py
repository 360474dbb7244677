"""learning/model_export.py: the ONNX agreement check can fail, and judges regression by value.

The command's tests (tests/integration/test_export.py) show exports that agree; these show the
check that says so is not vacuous: a model other than the exported one is caught on the samples
where it predicts otherwise, and a regression task (no argmax) is compared by its values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedasync.learning.dataset import Dataset
from fedasync.learning.model_export import (
    ExportError,
    agreement,
    onnx_bytes,
    torch_module,
    torch_task,
)
from fedasync.learning.tasks import get_task
from fedasync.learning.torch_task import TorchTask


class Regression(TorchTask):
    """3 features → 1 value, a torch module with no classes."""

    def __init__(self) -> None:
        super().__init__(name="regression", num_classes=0, buffers=False)

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        X = rng.normal(size=(64, 3)).astype(np.float32)
        y = X.sum(axis=1)
        return Dataset(X[:48], y[:48]), Dataset(X[48:], y[48:])


def test_an_onnx_model_of_other_weights_is_caught_on_the_samples_it_predicts_otherwise() -> None:
    task = torch_task(get_task("digits"), "digits")
    rng = np.random.default_rng(0)
    exported = torch_module(task, "digits", task.init_weights(rng))
    other = torch_module(task, "digits", task.init_weights(rng))
    data = Dataset(rng.uniform(size=(200, 64)).astype(np.float32), np.zeros(200, np.int64))
    model = onnx_bytes(exported, data.X[:1], {})
    same = agreement(model, exported, data, task.num_classes)
    assert (same.samples, same.equal, same.ok) == (200, 200, True)
    assert same.max_difference < 1e-5
    differs = agreement(model, other, data, task.num_classes)
    with torch.no_grad():
        x = torch.from_numpy(data.X)
        expected = int((exported(x).argmax(1) == other(x).argmax(1)).sum())
    assert expected < 200  # the fault is real: the two models disagree somewhere
    assert (differs.equal, differs.ok) == (expected, False)


def test_a_regression_task_agrees_by_value_not_by_argmax() -> None:
    task = Regression()
    weights = task.init_weights(np.random.default_rng(1))
    module = torch_module(task, "regression", weights)
    _, test = task.dataset(np.random.default_rng(2))
    model = onnx_bytes(module, test.X[:1], {})
    agreed = agreement(model, module, test, task.num_classes)
    assert (agreed.samples, agreed.equal, agreed.classification) == (16, 16, False)
    shifted = torch_module(task, "regression", weights + np.float32(0.01))
    # every output moves: a 1-column argmax would still call them equal, values do not
    assert agreement(model, shifted, test, task.num_classes).equal == 0


def test_a_module_whose_trace_would_not_generalise_is_refused_in_one_line() -> None:
    """A Python branch on a tensor's value: the trace keeps the example's branch only."""

    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(ExportError, match=r"^torch\.onnx traced the module into a graph that may "
                       r"not hold for other inputs: TracerWarning: Converting a tensor to a "
                       r"Python boolean") as caught:  # fmt: skip
        onnx_bytes(Branchy(), np.ones((1, 3), np.float32), {})
    assert "\n" not in str(caught.value)


def test_a_module_torch_onnx_cannot_export_is_one_line() -> None:
    class Named(nn.Module):
        def forward(self, x: torch.Tensor) -> str:
            return "not a tensor"

    with pytest.raises(ExportError, match=r"^torch\.onnx could not export the module: ") as caught:
        onnx_bytes(Named(), np.ones((1, 3), np.float32), {})
    assert "\n" not in str(caught.value)
