"""A task's own code failing is one line naming the task, the method and the user's frame
(learning/task_failure.py), in the simulator as in the services; the traceback is kept apart."""

from __future__ import annotations

import copy
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedasync.learning.task_failure import TaskCodeError, guarded
from fedasync.learning.tasks import get_task
from fedasync.services.commands.cli import main

MYTASK = Path(__file__).resolve().parents[1] / "out_of_tree" / "mytask.py"


@pytest.fixture
def task_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    shutil.copy(MYTASK, tmp_path / "mytask.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("mytask", None)


def failing_line(folder: Path) -> int:
    lines = (folder / "mytask.py").read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if "TRAIN FAILS HERE" in text)


def test_a_failing_train_names_the_task_the_method_and_the_users_line(task_folder: Path) -> None:
    task = guarded(get_task("mytask:TrainFails"), "mytask:TrainFails")
    weights = task.init_weights(np.random.default_rng(0))
    data, _ = task.dataset(np.random.default_rng(0))
    with pytest.raises(TaskCodeError) as raised:
        task.train(weights, data, np.random.default_rng(0), epochs=1, lr=0.1, batch_size=8)
    where = f"{task_folder / 'mytask.py'}:{failing_line(task_folder)}"
    message = str(raised.value)
    assert message.startswith(
        f"task 'mytask:TrainFails': its train failed at {where} (in train): ValueError: "
        "cannot reshape array"
    )
    assert "\n" not in message
    assert "numpy" not in message  # the frame named is the user's, not numpy's below it
    assert "Traceback (most recent call last)" in raised.value.details
    assert "np.reshape(weights, (7, -1, 5))" in raised.value.details
    # what the simulator's seed processes send back is rebuilt with its details (__reduce__)
    rebuilt = copy.deepcopy(raised.value)
    assert (str(rebuilt), rebuilt.details) == (message, raised.value.details)


def test_simulate_with_a_failing_train_is_one_line_and_exit_2(
    task_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sim.toml"
    config.write_text(
        'name = "fails"\n[task]\nname = "mytask:TrainFails"\n[fleet]\ndevices = 2\n'
        "[budget]\nmax_updates = 5\nmax_seconds = 600\n"
        '[[algorithms]]\nkind = "fedasync"\nname = "fedasync"\n'
    )
    assert main(["simulate", "--config", str(config), "--quiet", "--out", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("fedasync: task 'mytask:TrainFails': its train failed at ")
    assert f"mytask.py:{failing_line(task_folder)} (in train): ValueError" in line
    kept = Path(line.rsplit("(its traceback: ", 1)[1].rstrip(")"))
    assert "np.reshape(weights, (7, -1, 5))" in kept.read_text()
    kept.unlink()
