"""A device's DP-SGD accountant in its state file: a restarted worker goes on counting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedasync.learning.dpsgd import DPSGD, DeviceAccountant
from fedasync.services.runtime.settings import SettingsError, load_settings
from fedasync.services.worker import dpsgd_state
from fedasync.services.worker.device import build_device


def trained_accountant(runs: int) -> DeviceAccountant:
    accountant = DeviceAccountant(DPSGD(1.0))
    accountant.restore([(1.0, 0.05, 40 * runs)], runs)
    return accountant


def test_a_saved_accountant_is_restored_with_its_history_runs_and_epsilon(tmp_path: Path) -> None:
    path = tmp_path / "dp.json"
    saved = trained_accountant(3)
    dpsgd_state.save(path, saved)
    restored = DeviceAccountant(DPSGD(1.0))
    dpsgd_state.load(path, restored)
    assert restored.history == saved.history
    assert restored.runs == 3
    assert restored.epsilon() == saved.epsilon() > 0
    assert not (tmp_path / "dp.json.tmp").exists()  # renamed over, not left behind


def test_no_file_yet_is_a_fresh_accountant(tmp_path: Path) -> None:
    accountant = DeviceAccountant(DPSGD(1.0))
    dpsgd_state.load(tmp_path / "absent.json", accountant)
    assert accountant.history == []
    assert accountant.epsilon() == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": 2, "runs": 1, "history": []}',
        '{"format": 1, "runs": 1, "history": [[0, 0.1, 5]]}',
        '{"format": 1, "runs": 1}',
    ],
)
def test_a_file_that_is_not_a_state_is_refused_in_one_line_naming_the_variable(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "dp.json"
    path.write_text(text)
    settings = load_settings(
        task={"name": "digits", "num_devices": 2},
        worker={"dpsgd_noise_multiplier": 1.0, "dpsgd_state": str(path)},
    )
    with pytest.raises(SettingsError) as info:
        build_device(settings.task, settings.worker)
    message = str(info.value)
    assert message.startswith("invalid settings: FEDASYNC_WORKER__DPSGD_STATE: ")
    assert str(path) in message
    assert "\n" not in message


def test_a_restarted_device_goes_on_from_its_saved_steps(tmp_path: Path) -> None:
    path = tmp_path / "dp.json"
    settings = load_settings(
        task={"name": "digits", "num_devices": 4},
        worker={"dpsgd_noise_multiplier": 1.0, "dpsgd_state": str(path), "epochs": 1},
    )
    first = build_device(settings.task, settings.worker)
    assert first.privacy is not None
    weights = first.task.init_weights(np.random.default_rng(0))
    train = first.train
    _, before = first.task.train(
        weights,
        first.data,
        np.random.default_rng(1),
        epochs=train.epochs,
        lr=train.lr,
        batch_size=train.batch_size,
        privacy=first.privacy,
    )
    dpsgd_state.save(path, first.privacy)
    second = build_device(settings.task, settings.worker)  # the worker, restarted
    assert second.privacy is not None
    assert second.privacy.epsilon() == before["dp_epsilon"]
    _, after = second.task.train(
        weights,
        second.data,
        np.random.default_rng(2),
        epochs=train.epochs,
        lr=train.lr,
        batch_size=train.batch_size,
        privacy=second.privacy,
    )
    assert after["dp_epsilon"] > before["dp_epsilon"]
    assert second.privacy.runs == 2
