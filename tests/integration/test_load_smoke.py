"""bench/load.py end to end with a small fleet: its machinery works and nothing is lost.

Run as a user runs it (a child process, an environment without FEDASYNC_ variables, so it
cannot lean on the Redis that happens to run on this machine). No timing is asserted: only that
every acknowledged update was decided exactly once, nothing is pending and the ledger replays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_small_fleet_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "bench/load.py", "--devices", "10", "--warmup", "1"]
    command += ["--seconds", "3", "--rate", "8", "--task", "linear", "--out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing lost" in done.stdout
    results = json.loads(out.read_text())
    ledger = results["ledger"]
    assert ledger["published"] > 0
    assert ledger["decisions"] == ledger["published"]
    assert ledger["missing"] == ledger["decided_more_than_once"] == ledger["pending"] == 0
    assert ledger["unexpected"] == ledger["wrong_entry"] == 0
    assert ledger["verify_ok"]
    assert not results["crashed"]
    fetched = sum(
        p["fetch_200_ms"]["n"] + p["fetch_304_ms"]["n"] + p["wake_ms"]["n"]
        for p in results["phases"].values()
    )
    assert fetched >= 10  # every device downloaded the model at least once
