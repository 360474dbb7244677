"""Progress where no terminal is: a short line per tenth of the budget or per half minute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedasync.sim.progress_lines import line_progress
from tests.sim.helpers import run_cli


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_tenth_of_the_simulated_budget_and_one_when_wall_time_passes() -> None:
    lines: list[str] = []
    clock = Clock()
    advance = line_progress(3600.0, lines.append, every_s=30.0, clock=clock)("fedasync")
    for second in range(0, 1080, 10):  # 0 .. 1070 simulated s: tenths at 360 and 720 s
        advance(float(second), second // 10)
    assert lines == [
        "[    0 s] fedasync: 6/60 simulated min (10%), 36 applied",
        "[    0 s] fedasync: 12/60 simulated min (20%), 72 applied",
    ]
    clock.now += 31.0  # half a minute of wall time with no line: one, though no tenth passed
    advance(1075.0, 107)
    advance(1076.0, 107)
    advance(1080.0, 108)  # the next tenth
    assert lines[2:] == [
        "[   31 s] fedasync: 18/60 simulated min (30%), 107 applied",
        "[   31 s] fedasync: 18/60 simulated min (30%), 108 applied",
    ]


def test_simulate_prints_progress_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "tiny.toml"
    toml.write_text(
        '[task]\nname = "linear"\nparams = {samples = 400}\n[fleet]\ndevices = 4\n'
        '[budget]\nmax_updates = 100000\nmax_seconds = 600\n[[algorithms]]\nkind = "fedasync"\n'
    )
    argv = ["simulate", "--config", str(toml), "--out", str(tmp_path / "o"), "--no-plots"]
    assert run_cli(argv) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if "simulated min" in line]
    # a line at the first decision past each tenth of the 10 simulated minutes (more only if
    # 30 s of wall time pass between two, which a loaded machine may make happen)
    tenths = {int(re.search(r"\((\d+)%\)", line)[1]) // 10 for line in progress}  # type: ignore[index]
    assert tenths >= set(range(1, 10))
    assert all(
        re.fullmatch(r"\[ +\d+ s\] fedasync: \d+/10 simulated min \(\d+%\), \d+ applied", line)
        for line in progress
    )
