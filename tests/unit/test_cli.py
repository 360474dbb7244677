"""The `fedasync` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedasync.services.commands.cli import main


def test_alpha_table_shows_every_rule_and_drops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alpha", "--max-tau", "12", "--tau-max", "10"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("tau"))
    assert header.split() == ["tau", "constant", "polynomial", "progress", "exponential", "hinge"]
    row5 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["5"])
    assert row5 == ["5", "0.6000", "0.2048", "0.2048", "0.3543", "0.0545"]  # hinge 0.6/11
    row11 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["11"])
    assert row11 == ["11"] + ["dropped"] * 5


def test_alpha_refuses_out_of_range_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alpha", "--gamma", "-1"]) == 2
    assert "gamma" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "fedasync"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "alpha" in result.stdout
    assert "settings" in result.stdout
