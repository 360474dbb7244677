"""An out-of-tree task named by import path, as a user runs it: `fedasync simulate`, `fedasync up`,
and each service; and a bad name refused in one line, exit code 2, before anything is started.

The task module (tests/out_of_tree/mytask.py) is copied into a temporary folder that only the
children's PYTHONPATH names: it is importable nowhere else, as a user's own package would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MYTASK = ROOT / "tests" / "out_of_tree" / "mytask.py"
#: an address nothing listens on: were a service to start after all, it could not reach any Redis
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    folder = tmp_path / "lib"
    folder.mkdir()
    shutil.copy(MYTASK, folder / "mytask.py")
    return folder


def env_with(lib: Path, **settings: str) -> dict[str, str]:
    """This environment without FEDASYNC_ variables, `lib` on PYTHONPATH, and `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(lib), env.get("PYTHONPATH")) if p)
    return env | settings


def fedasync(*argv: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fedasync.services.commands.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        ("bogus", "task 'bogus': not a built-in task (digits, linear, synthetic)"),
        ("mytask:nope", "task 'mytask:nope': module mytask has no attribute 'nope'"),
        ("nowhere:make", "task 'nowhere:make': no module named 'nowhere'"),
    ],
)
def test_up_with_a_bad_task_prints_one_line_exits_2_and_starts_nothing(
    tmp_path: Path, lib: Path, task: str, reason: str
) -> None:
    out = tmp_path / "run"
    process = fedasync(
        "up", "--no-live", "--out", str(out), "--task", task, env=env_with(lib), cwd=tmp_path
    )
    stdout, stderr = finish(process, timeout=60)
    assert process.returncode == 2, stdout + stderr
    assert stdout == ""
    [line] = stderr.splitlines()
    assert line.startswith(f"fedasync: invalid settings: --task {task}: ")  # what was typed
    assert reason in line
    # the run folder holds the private Redis (redis/) and every child's log (logs/): it was
    # never even created, so neither Redis nor any service or device process was started
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [lib]


@pytest.mark.parametrize(
    ("service", "task", "reason"),
    [
        ("aggregator", "mytask:nope", "module mytask has no attribute 'nope'"),
        ("evaluator", "mytask:NotATask", "is a class but not a subclass of fedasync.Task"),
        ("worker", "mytask:returns_a_string", "returned str, not a fedasync.Task"),
        ("control", "bogus", "not a built-in task"),
        ("snapshot", "bogus", "not a built-in task"),
        ("ingest", "bogus", "not a built-in task"),
    ],
)
def test_a_service_refuses_a_bad_task_in_one_line_with_exit_code_2(
    tmp_path: Path, lib: Path, service: str, task: str, reason: str
) -> None:
    env = env_with(lib, FEDASYNC_TASK__NAME=task, FEDASYNC_REDIS__URL=NOWHERE)
    process = subprocess.run(
        [sys.executable, "-m", f"fedasync.services.{service}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert process.returncode == 2, process.stderr
    assert process.stdout == ""
    name = "worker-0" if service == "worker" else service  # a worker's name: from its settings
    [line] = process.stderr.splitlines()
    assert line.startswith(f"{name}: invalid settings: FEDASYNC_TASK__NAME: task {task!r}: ")
    assert reason in line


def test_a_service_builds_its_task_with_the_params_before_it_starts(
    tmp_path: Path, lib: Path
) -> None:
    env = env_with(
        lib,
        FEDASYNC_TASK__NAME="mytask:make",
        FEDASYNC_TASK__PARAMS='{"classes": 1}',
        FEDASYNC_REDIS__URL=NOWHERE,
    )
    process = subprocess.run(
        [sys.executable, "-m", "fedasync.services.aggregator"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert process.returncode == 2, process.stderr
    [line] = process.stderr.splitlines()
    assert line.startswith("aggregator: invalid settings: FEDASYNC_TASK__PARAMS: task 'mytask:")
    assert "classes must be >= 2" in line


def simulation_config(path: Path, task: str) -> Path:
    path.write_text(
        f'[task]\nname = "{task}"\nparams = {{classes = 3, samples = 600}}\n'
        '[fleet]\ndevices = 4\n[fleet.latency]\nkind = "fixed"\nmedians_s = [10, 20]\n'
        "[budget]\nmax_updates = 40\n[eval]\ninterval_s = 30\n"
        '[[algorithms]]\nkind = "fedasync"\n'
    )
    return path


def test_simulate_with_a_bad_task_name_prints_one_line_and_exits_2(
    tmp_path: Path, lib: Path
) -> None:
    for task, reason in (
        ("bogus", "invalid simulation config: task.name = \"bogus\": task 'bogus': not a built-in"),
        ("mytask:Incomplete", "fedasync: task 'mytask:Incomplete': Incomplete does not implement"),
    ):
        config = simulation_config(tmp_path / "bad.toml", task)
        out = tmp_path / "out"
        argv = ("simulate", "--config", str(config), "--out", str(out), "--no-plots")
        process = fedasync(*argv, env=env_with(lib), cwd=tmp_path)
        stdout, stderr = finish(process, timeout=60)
        assert process.returncode == 2, stderr
        assert stdout == ""
        [line] = stderr.splitlines()
        assert reason in line
        assert not out.exists()


def test_simulate_runs_an_out_of_tree_task_by_its_import_path(tmp_path: Path, lib: Path) -> None:
    config = simulation_config(tmp_path / "mine.toml", "mytask:make")
    out = tmp_path / "out"
    argv = ("simulate", "--config", str(config), "--out", str(out), "--no-plots", "--quiet")
    process = fedasync(*argv, env=env_with(lib), cwd=tmp_path)
    stdout, stderr = finish(process, timeout=120)
    assert process.returncode == 0, stderr
    assert "fedasync: final" in stdout
    summary = json.loads((out / "summary.json").read_text())
    result = summary["algorithms"]["fedasync"]
    assert result["updates"]["applied"] == 40
    assert result["final"]["score"] > 0.7  # three classes: chance is 1/3


def test_up_trains_an_out_of_tree_task_by_its_import_path(tmp_path: Path, lib: Path) -> None:
    out = tmp_path / "run"
    options = ("--devices", "2", "--profile", "none", "--max-updates", "30")
    params = '{"classes": 4}'  # reaches every child: the evaluator scores four classes
    argv = ("up", "--no-live", "--out", str(out), "--task", "mytask:make", "--task-params", params)
    process = fedasync(*argv, *options, env=env_with(lib), cwd=tmp_path)
    stdout, stderr = finish(process, timeout=240)
    assert process.returncode == 0, stdout + stderr
    assert "task mytask:make (iid, seed 0)" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["task"]["name"] == "mytask:make"
    assert summary["settings"]["task"]["params"] == {"classes": 4}
    assert summary["ended_by"] == "max_updates"
    assert summary["updates"]["applied"] == 30
    assert summary["updates"]["rejected"] == 0  # every worker built the aggregator's model
    assert summary["final"]["version"] == 30
    assert len(summary["final"]["per_class"]) == 4
    assert summary["final"]["accuracy"] > 0.6  # four classes: chance is 1/4
    assert summary["problems"] == []
