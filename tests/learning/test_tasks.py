"""Tasks: the registry, numpy-only initial models, training from a copy, evaluation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedasync.learning.task import Task
from fedasync.learning.tasks import TASKS, TaskError, get_task

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"linear": {"samples": 600}, "synthetic": {"samples": 600, "groups": 6}, "digits": {}}


def small(name: str) -> Task:
    return get_task(name, **SMALL[name])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_train_returns_new_weights_and_never_touches_its_input(name: str) -> None:
    task = small(name)
    rng = np.random.default_rng(0)
    train, _ = task.dataset(rng)
    weights = task.init_weights(rng)
    before = weights.copy()
    weights.flags.writeable = False  # any write to the input would raise
    new, metrics = task.train(
        weights, train.subset(np.arange(64)), rng, epochs=1, lr=0.05, batch_size=16
    )
    assert np.array_equal(weights, before)
    assert new.dtype == np.float32
    assert new.shape == (task.layout.size,)
    assert not np.shares_memory(new, weights)
    assert not np.array_equal(new, before)
    assert metrics["num_samples"] == 64.0
    assert np.isfinite(metrics["loss"])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_same_generator_gives_the_same_weights(name: str) -> None:
    task = small(name)
    train, _ = task.dataset(np.random.default_rng(1))
    start = task.init_weights(np.random.default_rng(2))
    runs = [
        task.train(start, train, np.random.default_rng(3), epochs=1, lr=0.05, batch_size=32)[0]
        for _ in range(2)
    ]
    assert runs[0].tobytes() == runs[1].tobytes()


def test_digits_training_from_a_copy_improves_accuracy() -> None:
    task = get_task("digits")
    rng = np.random.default_rng(0)
    train, test = task.dataset(rng)
    start = task.init_weights(rng)
    snapshot = start.copy()
    before = task.evaluate(start, test)
    trained, _ = task.train(snapshot, train, rng, epochs=3, lr=0.1, batch_size=16)
    after = task.evaluate(trained, test)
    assert np.array_equal(snapshot, start)
    assert before.accuracy is not None
    assert after.accuracy is not None
    assert after.accuracy > before.accuracy + 0.5
    assert after.accuracy > 0.85
    assert set(after.per_class) == set(range(10))
    assert after.loss < before.loss


def test_regression_scores_by_r2_and_has_no_accuracy() -> None:
    task = small("linear")
    rng = np.random.default_rng(0)
    train, test = task.dataset(rng)
    zero = task.evaluate(task.init_weights(rng), test)
    trained, _ = task.train(task.init_weights(rng), train, rng, epochs=5, lr=0.05, batch_size=32)
    fitted = task.evaluate(trained, test)
    assert zero.accuracy is None
    assert fitted.accuracy is None
    assert fitted.r2 is not None
    assert fitted.score == fitted.r2 > 0.99
    assert fitted.loss < zero.loss


def test_synthetic_classes_and_layout() -> None:
    task = get_task("synthetic", alpha=1.0, beta=1.0, dim=20, classes=5, groups=4, samples=400)
    train, test = task.dataset(np.random.default_rng(0))
    assert task.num_classes == 5
    assert task.layout.size == 20 * 5 + 5
    assert train.X.shape[1] == 20
    assert set(np.unique(train.y)) <= set(range(5))
    assert len(train) + len(test) == 400


def test_digits_init_matches_torch_default_bounds() -> None:
    task = get_task("digits", hidden=16)
    parts = task.layout.split(task.init_weights(np.random.default_rng(0)))
    assert np.abs(parts["hidden.weight"]).max() <= 1 / 8  # 1/sqrt(64)
    assert np.abs(parts["out.weight"]).max() <= 1 / 4  # 1/sqrt(16)
    assert parts["hidden.weight"].shape == (16, 64)


def test_initial_model_and_evaluation_need_no_torch() -> None:
    code = (
        "import sys, numpy as np\n"
        "from fedasync.learning.tasks import get_task\n"
        "t = get_task('digits')\n"
        "w = t.init_weights(np.random.default_rng(0))\n"
        "_, test = t.dataset(np.random.default_rng(0))\n"
        "t.evaluate(w, test)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_unknown_task_or_parameter_is_a_clear_error() -> None:
    with pytest.raises(TaskError, match="not a built-in task"):
        get_task("mnist")
    with pytest.raises(TaskError, match="digits"):
        get_task("digits", width=3)
    task = small("linear")
    with pytest.raises(ValueError, match="expected 20 weights"):
        task.evaluate(np.zeros(3, np.float32), task.dataset(np.random.default_rng(0))[1])
