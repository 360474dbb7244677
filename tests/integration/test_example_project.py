"""examples/custom-model, used as a user uses it: installed with pip, named by its import path.

The example is a project of its own (its own pyproject.toml, a CNN of its own, its task in one
file). It is pip-installed into this test environment once per session, not imported from the
checkout, and run from a folder outside the checkout: `fedasync simulate --config` with the
example's config, and `fedasync up --task custom_model.task:make`, each to its budget and above
chance (four classes: 0.25).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-model"
CHANCE = 0.25


@pytest.fixture(scope="session")
def example_installed() -> None:
    """`pip install examples/custom-model` (no dependencies: fedasync and torch are here)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--force-reinstall", str(EXAMPLE)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    where = subprocess.run(
        [sys.executable, "-c", "import custom_model; print(custom_model.__file__)"],
        cwd="/", check=True, capture_output=True, text=True,
    )  # fmt: skip
    installed_at = Path(where.stdout.strip())
    assert installed_at.is_relative_to(sysconfig.get_paths()["purelib"]), installed_at


def fedasync(*argv: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    return subprocess.run(
        [sys.executable, "-m", "fedasync.services.commands.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_example_simulates_by_its_import_path(example_installed: None, tmp_path: Path) -> None:
    out = tmp_path / "sim"
    config = str(EXAMPLE / "simulate.toml")
    done = fedasync(
        "simulate", "--config", config, "--out", str(out), "--no-plots", "--quiet",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["task"]["name"] == "custom_model.task:make"
    for name in ("fedasync", "fedavg"):
        result = summary["algorithms"][name]
        assert result["ended_by"] == "max_updates", name
        assert result["final"]["score"] > 2 * CHANCE, (name, result["final"])


def test_the_example_trains_in_up_by_its_import_path(
    example_installed: None, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = fedasync(
        "up", "--no-live", "--out", str(out), "--task", "custom_model.task:make",
        "--devices", "3", "--profile", "none", "--max-updates", "80",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["task"]["name"] == "custom_model.task:make"
    assert summary["ended_by"] == "max_updates"
    assert summary["updates"]["applied"] == 80
    assert summary["updates"]["rejected"] == 0
    assert summary["final"]["accuracy"] > CHANCE, summary["final"]
