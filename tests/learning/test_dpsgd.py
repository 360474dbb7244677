"""DP-SGD on the device: Opacus trains the digits MLP, reproducibly, and the device's own accountant
reports Opacus's ε for every step it ever took, growing with each run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from torch import nn

from fedasync.learning.dataset import Dataset
from fedasync.learning.digits import DigitsMLP
from fedasync.learning.dpsgd import DPSGD, FIX, DeviceAccountant, DPSGDError
from fedasync.learning.linear import LinearRegression
from fedasync.learning.task_failure import guarded
from fedasync.learning.torch_task import check_private
from fedasync.shared.device_privacy import DEVICE_DELTA, DEVICE_EPSILON
from tests.learning.torch_models import QuadrantTask

ROOT = Path(__file__).resolve().parents[2]
DP = DPSGD(noise_multiplier=1.1, max_grad_norm=1.0, delta=1e-5)
SAMPLES, BATCH, EPOCHS = 200, 16, 2


def device_data() -> tuple[DigitsMLP, Dataset, np.ndarray]:
    task = DigitsMLP(hidden=16)
    train, _ = task.dataset(np.random.default_rng(0))
    return task, train.subset(np.arange(SAMPLES)), task.init_weights(np.random.default_rng(1))


def private_run(
    task: DigitsMLP, data: Dataset, weights: np.ndarray, accountant: DeviceAccountant, seed: int
) -> tuple[np.ndarray, dict[str, float]]:
    return task.train(
        weights,
        data,
        np.random.default_rng(seed),
        epochs=EPOCHS,
        lr=0.1,
        batch_size=BATCH,
        privacy=accountant,
    )


def test_a_dpsgd_run_on_digits_changes_the_weights_and_reports_the_devices_epsilon() -> None:
    task, data, start = device_data()
    accountant = DeviceAccountant(DP)
    trained, metrics = private_run(task, data, start, accountant, seed=5)
    assert trained.dtype == np.float32
    assert trained.shape == start.shape
    assert not np.array_equal(trained, start)
    for name, part in task.layout.split(trained).items():  # every tensor moved
        assert not np.array_equal(part, task.layout.split(start)[name]), name
    assert metrics["num_samples"] == SAMPLES
    assert math.isfinite(metrics["loss"])
    assert metrics[DEVICE_EPSILON] > 0
    assert metrics[DEVICE_DELTA] == DP.delta
    assert accountant.runs == 1


def test_two_seeded_dpsgd_runs_give_the_same_weights_to_the_bit() -> None:
    """On CPU, Opacus's Poisson batches and its noise come from torch's generator, which the
    task seeds from the run's generator: the same seed, the same bits."""
    task, data, start = device_data()
    first, m1 = private_run(task, data, start, DeviceAccountant(DP), seed=5)
    second, m2 = private_run(task, data, start, DeviceAccountant(DP), seed=5)
    other, _ = private_run(task, data, start, DeviceAccountant(DP), seed=6)
    assert first.tobytes() == second.tobytes()
    assert m1 == m2
    assert other.tobytes() != first.tobytes()


def test_dpsgd_is_not_plain_training() -> None:
    task, data, start = device_data()
    private, _ = private_run(task, data, start, DeviceAccountant(DP), seed=5)
    plain, metrics = task.train(
        start, data, np.random.default_rng(5), epochs=EPOCHS, lr=0.1, batch_size=BATCH
    )
    assert not np.array_equal(private, plain)
    assert DEVICE_EPSILON not in metrics  # plain training reports no ε


def test_the_reported_epsilon_is_opacus_rdp_accountant_for_the_same_steps_and_grows() -> None:
    """Each run takes ⌈n/B⌉ Poisson steps per epoch at q = 1/⌈n/B⌉; after k runs the device
    reports the ε of an RDP accountant given k·epochs·⌈n/B⌉ such steps, at its δ."""
    task, data, weights = device_data()
    accountant = DeviceAccountant(DP)
    per_epoch = math.ceil(SAMPLES / BATCH)
    reported = []
    for run in range(1, 4):
        weights, metrics = private_run(task, data, weights, accountant, seed=10 + run)
        reference = RDPAccountant()
        reference.history = [(DP.noise_multiplier, 1 / per_epoch, run * EPOCHS * per_epoch)]
        assert metrics[DEVICE_EPSILON] == reference.get_epsilon(delta=DP.delta)
        assert metrics[DEVICE_EPSILON] == accountant.epsilon()
        reported.append(metrics[DEVICE_EPSILON])
    assert reported == sorted(reported)
    assert len(set(reported)) == 3  # strictly growing
    assert accountant.runs == 3


def test_a_model_without_per_sample_gradients_is_refused_naming_the_fix() -> None:
    with pytest.raises(DPSGDError) as info:
        check_private(guarded(QuadrantTask(), "quadrant"), "quadrant")
    message = str(info.value)
    assert "BatchNorm" in message
    assert FIX in message
    assert "\n" not in message


def test_a_task_that_is_not_a_torch_task_is_refused() -> None:
    with pytest.raises(DPSGDError, match="TorchTask"):
        check_private(LinearRegression(), "linear")


def test_digits_passes_the_check() -> None:
    check_private(guarded(DigitsMLP(), "digits"), "digits")


@pytest.mark.parametrize(
    ("noise", "clip", "delta"),
    [(0.0, 1.0, 1e-5), (1.0, 0.0, 1e-5), (1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (math.nan, 1, 1e-5)],
)
def test_settings_out_of_range_are_refused(noise: float, clip: float, delta: float) -> None:
    with pytest.raises(DPSGDError):
        DPSGD(noise, clip, delta)


def test_a_run_without_dpsgd_never_imports_opacus() -> None:
    """Opacus costs seconds of import: training, the sim and the worker's device without
    DP-SGD, and even the DP-SGD settings and a fresh accountant, leave it unimported."""
    code = (
        "import sys, numpy as np\n"
        "from fedasync.learning.dpsgd import DPSGD, DeviceAccountant\n"
        "from fedasync.services.worker import device, service\n"
        "from fedasync.sim.runner import simulate\n"
        "from tests.sim.helpers import config\n"
        "simulate(config())\n"
        "from fedasync.learning.digits import DigitsMLP\n"
        "task = DigitsMLP(hidden=8)\n"
        "train, _ = task.dataset(np.random.default_rng(0))\n"
        "w = task.init_weights(np.random.default_rng(1))\n"
        "task.train(w, train.subset(np.arange(40)), np.random.default_rng(2), epochs=1,"
        " lr=0.1, batch_size=8)\n"
        "assert DeviceAccountant(DPSGD(1.0)).epsilon() == 0.0\n"
        "print('torch' in sys.modules, 'opacus' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["True", "False"]


def test_empty_poisson_batches_take_their_noise_step_and_leave_the_loss_finite() -> None:
    """10 samples at q = 1/10: a batch is empty with probability 0.9^10 ≈ 0.35, so this seeded
    run of 30 steps meets several (the chance of none is 2e-6); each is still a step."""
    task, data, start = device_data()
    accountant = DeviceAccountant(DP)
    trained, metrics = task.train(
        start,
        data.subset(np.arange(10)),
        np.random.default_rng(3),
        epochs=3,
        lr=0.1,
        batch_size=1,
        privacy=accountant,
    )
    assert np.isfinite(trained).all()
    assert math.isfinite(metrics["loss"])
    assert accountant.history == [(DP.noise_multiplier, 0.1, 30)]


class FixedQuadrant(QuadrantTask):
    """The refused model after the fix the refusal names: BatchNorm replaced by GroupNorm."""

    def model(self) -> nn.Module:
        from opacus.validators import ModuleValidator

        fixed: nn.Module = ModuleValidator.fix(super().model())
        return fixed


def test_the_named_fix_makes_the_refused_model_train_with_dpsgd() -> None:
    task = FixedQuadrant(samples=64)
    check_private(guarded(task, "quadrant"), "quadrant")
    train, _ = task.dataset(np.random.default_rng(0))
    start = task.init_weights(np.random.default_rng(1))
    trained, metrics = task.train(
        start,
        train,
        np.random.default_rng(2),
        epochs=1,
        lr=0.05,
        batch_size=8,
        privacy=DeviceAccountant(DP),
    )
    assert not np.array_equal(trained, start)
    assert metrics[DEVICE_EPSILON] > 0
