"""TorchTask: a torch model trains through the Task interface, reproducibly, on a private copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedasync.learning.dataset import Dataset, split
from fedasync.learning.digits import DigitsMLP
from fedasync.learning.task import TrainParams
from fedasync.learning.torch_task import torch_seed
from fedasync.shared.layout import Layout
from fedasync.torch import TorchTask, VectorMismatchError, layout_of
from tests.learning.torch_models import QuadrantTask, digest

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_cnn_trains_and_its_weights_and_statistics_change() -> None:
    task = QuadrantTask()
    train, test = task.dataset(np.random.default_rng(0))
    start = task.init_weights(np.random.default_rng(1))
    assert task.layout == layout_of(task.model(), buffers=True)
    before = task.evaluate(start, test)
    trained, metrics = task.train(
        start, train, np.random.default_rng(2), epochs=4, lr=0.05, batch_size=16
    )
    after = task.evaluate(trained, test)
    old, new = task.layout.split(start), task.layout.split(trained)
    for name in (
        "conv.weight",
        "norm.weight",
        "norm.running_mean",
        "norm.running_var",
        "head.bias",
    ):
        assert not np.array_equal(old[name], new[name]), name
    assert metrics["num_samples"] == float(len(train))
    assert np.isfinite(metrics["loss"])
    assert before.accuracy is not None
    assert after.accuracy is not None
    assert after.loss < before.loss
    assert after.accuracy > 0.5  # four classes: chance is 0.25
    assert set(after.per_class) <= set(range(4))


def test_training_leaves_its_input_and_torchs_generator_alone() -> None:
    task = QuadrantTask()
    train, _ = task.dataset(np.random.default_rng(0))
    weights = task.init_weights(np.random.default_rng(1))
    before = weights.copy()
    weights.flags.writeable = False
    torch.manual_seed(123)
    generator = torch.get_rng_state()
    task.train(weights, train, np.random.default_rng(2), epochs=1, lr=0.05, batch_size=16)
    assert torch.equal(torch.get_rng_state(), generator)
    assert np.array_equal(weights, before)


def test_same_seed_same_bits_another_seed_other_bits() -> None:
    assert digest(5) == digest(5)
    assert digest(5) != digest(6)


def test_same_bits_in_another_process_with_another_hash_seed() -> None:
    env = dict(os.environ, PYTHONHASHSEED="4242")
    child = subprocess.run(
        [sys.executable, "-m", "tests.learning.torch_models", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == digest(5)


def test_the_torch_seed_does_not_advance_the_generator() -> None:
    rng, twin = np.random.default_rng(9), np.random.default_rng(9)
    first, second = torch_seed(rng), torch_seed(rng)
    assert first != second  # each call spawns the next child
    assert rng.random() == twin.random()  # the stream (batch shuffling) is where it was


def test_digits_is_a_torch_task_whose_numpy_parts_match_its_module() -> None:
    task = DigitsMLP(hidden=12)
    assert isinstance(task, TorchTask)
    assert task.layout == layout_of(task.model(), buffers=False)
    _, test = task.dataset(np.random.default_rng(0))
    weights = task.init_weights(np.random.default_rng(1))
    in_numpy = task.evaluate(weights, test)
    in_torch = TorchTask.evaluate(task, weights, test)
    assert in_numpy.accuracy == in_torch.accuracy
    assert in_numpy.loss == pytest.approx(in_torch.loss, rel=1e-5)


class Misdeclared(QuadrantTask):
    def __init__(self) -> None:
        self.channels, self.samples = 4, 40
        TorchTask.__init__(
            self,
            name="misdeclared",
            num_classes=4,
            buffers=False,
            layout=Layout.of([("conv.weight", (4, 1, 3, 3)), ("conv.bias", (5,))]),
        )


def test_a_declared_layout_that_is_not_the_modules_is_a_typed_error() -> None:
    task = Misdeclared()
    train, _ = task.dataset(np.random.default_rng(0))
    with pytest.raises(VectorMismatchError, match=r"conv\.bias") as error:
        task.train(
            np.zeros(41, np.float32),
            train,
            np.random.default_rng(0),
            epochs=1,
            lr=0.1,
            batch_size=8,
        )
    assert error.value.tensor == "conv.bias"


class Line(TorchTask):
    """Regression with the default loss (MSE) and a momentum optimizer."""

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        super().__init__(name="line", num_classes=0, buffers=False, suggested=TrainParams(lr=0.1))

    def model(self) -> nn.Module:
        return nn.Linear(3, 1)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        X = rng.normal(size=(300, 3))
        return split(Dataset(X, X @ np.array([1.0, -2.0, 0.5]) + 0.3), 0.2, rng)

    def optimizer(self, model: nn.Module, lr: float) -> torch.optim.Optimizer | None:
        return (
            torch.optim.SGD(model.parameters(), lr=lr, momentum=self.momentum)
            if self.momentum
            else None
        )


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_regression_with_the_default_loss_or_an_optimizer_of_the_tasks_choice(
    momentum: float,
) -> None:
    task = Line(momentum)
    train, test = task.dataset(np.random.default_rng(0))
    start = task.init_weights(np.random.default_rng(1))
    trained, _ = task.train(
        start, train, np.random.default_rng(2), epochs=5, lr=0.05, batch_size=16
    )
    scores = task.evaluate(trained, test)
    assert scores.accuracy is None
    assert scores.r2 is not None
    assert scores.r2 > 0.99


DOUBLE_TASK = """
from torch import nn
from tests.learning.torch_models import QuadrantTask


class Double(QuadrantTask):
    def __init__(self, width: int = 4) -> None:
        self.width = width
        super().__init__()

    def model(self) -> nn.Module:
        return super().model().double()
"""


def test_a_float64_model_is_named_by_its_dtype_not_as_refused_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedasync.learning.tasks import TaskBuildError, get_task

    (tmp_path / "double_task.py").write_text(DOUBLE_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TaskBuildError) as info:  # not TaskParamsError: width is fine
            get_task("double_task:Double", width=4)
    finally:
        sys.modules.pop("double_task", None)
    message = str(info.value)
    assert "params" not in message
    assert "dtype torch.float64" in message
    assert "accepted: torch.float32, torch.float16, torch.bfloat16" in message
