"""Tasks by import path: one resolver for every place a task is named, and every way it can fail.

The task module (tests/out_of_tree/mytask.py) is copied into a temporary folder put on sys.path,
as a user's own module would be importable: installed, or on PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedasync
from fedasync.learning.digits import DigitsMLP
from fedasync.learning.tasks import (
    NotATaskError,
    TaskAttributeError,
    TaskBuildError,
    TaskError,
    TaskImportError,
    TaskNameError,
    TaskParamsError,
    get_task,
    task_data,
)
from fedasync.services.commands.cli import main
from fedasync.services.runtime import settings as settings_module
from fedasync.services.runtime.settings import SettingsError, TaskSettings, load_settings
from fedasync.sim.config import ConfigError, build

MYTASK = Path(__file__).resolve().parents[1] / "out_of_tree" / "mytask.py"
MODULES = ("mytask", "brokenimport")


@pytest.fixture
def task_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """mytask.py and a module whose own import fails, importable for this test only."""
    shutil.copy(MYTASK, tmp_path / "mytask.py")
    (tmp_path / "brokenimport.py").write_text("import not_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in settings_module.setting_names():
        monkeypatch.delenv(name, raising=False)


def test_the_task_interface_is_public() -> None:
    for name in ("Task", "TrainParams", "Dataset", "Evaluation", "Layout"):
        assert name in fedasync.__all__
        assert getattr(fedasync, name).__module__.startswith("fedasync.")
    assert isinstance(get_task("linear"), fedasync.Task)


def test_a_built_in_name_still_builds_with_its_params() -> None:
    task = get_task("digits", hidden=8)
    assert isinstance(task, DigitsMLP)
    assert task.hidden == 8


@pytest.mark.usefixtures("task_folder")
def test_a_task_subclass_by_import_path_is_built_with_the_params() -> None:
    task = get_task("mytask:Blobs", classes=4, dim=3)
    assert isinstance(task, fedasync.Task)
    assert type(task).__name__ == "Blobs"
    assert task.num_classes == 4
    assert task.layout.size == 4 * 3 + 4


@pytest.mark.usefixtures("task_folder")
def test_a_factory_by_import_path_gets_the_params_as_keyword_arguments() -> None:
    task = get_task("mytask:make", classes=5, samples=100)
    assert task.num_classes == 5
    train, test = task.dataset(np.random.default_rng(0))
    assert len(train) + len(test) == 100
    assert get_task("mytask:make").num_classes == 3  # its defaults when no params are given
    assert get_task("mytask:Blobs.small").num_classes == 2  # a dotted attribute


@pytest.mark.usefixtures("task_folder")
def test_the_out_of_tree_task_learns() -> None:
    task = get_task("mytask:make")
    rng = np.random.default_rng(0)
    train, test = task.dataset(rng)
    start = task.init_weights(rng)
    trained, metrics = task.train(start, train, rng, epochs=3, lr=0.5, batch_size=32)
    assert not start.any()  # trained from a copy
    result = task.evaluate(trained, test)
    assert result.accuracy is not None
    assert result.accuracy > 0.8  # chance is 1/3
    assert metrics["num_samples"] == len(train)


ERRORS: list[tuple[str, dict[str, Any], type[TaskError], str]] = [
    ("bogus", {}, TaskNameError, "not a built-in task (digits, linear, synthetic)"),
    ("mytask.make", {}, TaskNameError, "an import path needs a colon"),
    ("mytask:", {}, TaskNameError, "dotted Python names on both sides of one colon"),
    ("my-task:make", {}, TaskNameError, "dotted Python names on both sides of one colon"),
    ("not_installed_xyz:make", {}, TaskImportError, "no module named 'not_installed_xyz'"),
    (
        "brokenimport:make",
        {},
        TaskImportError,
        "importing brokenimport failed: ModuleNotFoundError: No module named "
        "'not_installed_dependency'",
    ),
    ("mytask:nope", {}, TaskAttributeError, "module mytask has no attribute 'nope'"),
    ("mytask:NOT_A_TASK", {}, NotATaskError, "is int, not a fedasync.Task subclass"),
    ("mytask:NotATask", {}, NotATaskError, "is a class but not a subclass of fedasync.Task"),
    ("mytask:Incomplete", {}, NotATaskError, "does not implement dataset, evaluate"),
    ("mytask:INSTANCE", {}, NotATaskError, "is a Task instance"),
    ("mytask:returns_a_string", {}, NotATaskError, "returned str, not a fedasync.Task"),
    ("mytask:no_layout", {}, NotATaskError, "its layout must be a fedasync.Layout, got nothing"),
    ("mytask:make", {"width": 3}, TaskParamsError, "unexpected keyword argument 'width'"),
    ("mytask:make", {"classes": 1}, TaskParamsError, "classes must be >= 2"),
    ("digits", {"hidden": 0}, TaskParamsError, "hidden must be >= 1"),
    ("mytask:broken", {}, TaskBuildError, "building it failed: RuntimeError: no data here"),
    ("mytask:main", {}, NotATaskError, "calling it exited (SystemExit 2)"),
]


@pytest.mark.usefixtures("task_folder")
@pytest.mark.parametrize(
    ("name", "params", "error", "message"), ERRORS, ids=[f"{e[2].__name__}-{e[0]}" for e in ERRORS]
)
def test_each_way_a_name_can_fail_is_its_own_error_with_one_clear_line(
    name: str, params: dict[str, Any], error: type[TaskError], message: str
) -> None:
    with pytest.raises(error) as info:
        get_task(name, **params)
    text = str(info.value)
    assert text.startswith(f"task {name!r}: ")
    assert message in text
    assert "\n" not in text


@pytest.mark.usefixtures("clean_env", "task_folder")
def test_settings_check_the_name_without_importing_and_build_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDASYNC_TASK__NAME", "bogus")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value) == (
        "invalid settings: FEDASYNC_TASK__NAME: task 'bogus': not a built-in task "
        "(digits, linear, synthetic) nor an import path package.module:attribute"
    )
    # well formed: valid settings (control, snapshot and ingest never import it) ...
    monkeypatch.setenv("FEDASYNC_TASK__NAME", "mytask:nope")
    settings = load_settings()
    assert "mytask" not in sys.modules
    # ... and building it, as the aggregator, evaluator, workers and `up` do first, fails
    with pytest.raises(SettingsError, match=r"^invalid settings: FEDASYNC_TASK__NAME: task "):
        settings.task.build()


@pytest.mark.usefixtures("clean_env", "task_folder")
def test_task_params_come_from_a_json_variable_and_a_refusal_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDASYNC_TASK__NAME", "mytask:make")
    monkeypatch.setenv("FEDASYNC_TASK__PARAMS", '{"classes": 4, "dim": 2}')
    settings = load_settings()
    assert settings.task.params == {"classes": 4, "dim": 2}
    assert settings.task.build().layout.size == 4 * 2 + 4
    refused = TaskSettings(name="mytask:make", params={"classes": 1})
    with pytest.raises(SettingsError, match="FEDASYNC_TASK__PARAMS: task 'mytask:make'"):
        refused.build()


def test_a_simulator_config_checks_the_name_in_one_line() -> None:
    algorithms = [{"kind": "fedasync"}]
    assert build({"task": {"name": "pkg.mod:make"}, "algorithms": algorithms}).task.name == (
        "pkg.mod:make"
    )
    with pytest.raises(ConfigError) as info:
        build({"task": {"name": "bogus"}, "algorithms": algorithms})
    assert str(info.value).startswith(
        "invalid simulation config: task.name = \"bogus\": task 'bogus': "
    )
    assert "\n" not in str(info.value)


@pytest.mark.usefixtures("clean_env", "task_folder")
def test_fedasync_settings_builds_the_task_it_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDASYNC_TASK__NAME", "mytask:broken")
    assert main(["settings"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "fedasync: invalid settings: FEDASYNC_TASK__NAME: task 'mytask:broken': building it "
        "failed: RuntimeError: no data here\n"
    )
    monkeypatch.setenv("FEDASYNC_TASK__NAME", "mytask:make")
    assert main(["settings"]) == 0
    assert '"name": "mytask:make"' in capsys.readouterr().out


@pytest.mark.usefixtures("task_folder")
def test_a_task_whose_data_cannot_be_made_is_one_task_error_line() -> None:
    task = get_task("mytask:DataFails")
    with pytest.raises(TaskBuildError) as raised:
        task_data("mytask:DataFails", task, np.random.default_rng(0))
    assert str(raised.value) == (
        "task 'mytask:DataFails': making its data failed: TypeError: ufunc 'multiply' did not "
        "contain a loop with signature matching types"
    )


@pytest.mark.parametrize("service", ["evaluator", "worker"])
def test_a_service_whose_task_data_fails_exits_2_with_one_line(
    task_folder: Path, service: str
) -> None:
    """Before: a numpy traceback from inside the running service, printed twice by `up`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env |= {
        "PYTHONPATH": str(task_folder),
        "FEDASYNC_TASK__NAME": "mytask:DataFails",
        "FEDASYNC_REDIS__URL": "redis://127.0.0.1:1/0",  # never reached: the data fails first
        "FEDASYNC_EVALUATOR__PORT": "0",
    }
    result = subprocess.run(
        [sys.executable, "-m", f"fedasync.services.{service}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert "task 'mytask:DataFails': making its data failed: TypeError" in line
