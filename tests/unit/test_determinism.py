"""Same initial state and updates ⇒ bit-identical weights and decisions, in any process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.unit.scenario import digest, run

ROOT = Path(__file__).resolve().parents[2]


def test_scenario_exercises_every_outcome() -> None:
    _, decisions = run(11)
    outcomes = Counter(d.outcome.value for d in decisions)
    assert set(outcomes) == {"applied", "dropped", "duplicate", "rejected"}
    assert any(d.server_step and d.alpha is not None and d.alpha < 0.3 for d in decisions)


def test_same_run_twice_in_one_process_is_identical() -> None:
    assert digest(11) == digest(11)
    assert digest(11) != digest(12)


def test_same_run_in_another_process_with_another_hash_seed_is_identical() -> None:
    env = dict(os.environ, PYTHONHASHSEED="12345")
    child = subprocess.run(
        [sys.executable, "-m", "tests.unit.scenario", "11"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == digest(11)
