"""A service started without a Redis says so in one line (exit code 2), never a traceback.

The real entry points, as processes, in an environment with no FEDASYNC_ variable at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SERVICES = ["control", "aggregator", "snapshot", "evaluator", "ingest", "worker"]


def clean_env(home: Path, **settings: str) -> dict[str, str]:
    """The environment of a fresh shell: no FEDASYNC_ variable but those given."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **settings}


def run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0]
    return lines[0]


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_without_a_redis_url_says_so_in_one_line(service: str, tmp_path: Path) -> None:
    result = run(
        [sys.executable, "-m", f"fedasync.services.{service}"], clean_env(tmp_path), tmp_path
    )
    line = assert_one_line(result, "FEDASYNC_REDIS__URL", "`fedasync up`")
    prefix = "worker-0" if service == "worker" else service
    assert line.startswith(f"{prefix}: no Redis configured: ")


def test_the_cli_gives_the_same_line(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "fedasync"
    result = run([str(script), "control"], clean_env(tmp_path), tmp_path)
    assert_one_line(result, "control: no Redis configured: set FEDASYNC_REDIS__URL")


def test_a_worker_that_publishes_through_ingest_needs_no_redis(tmp_path: Path) -> None:
    """It holds no Redis credentials: not a missing setting. (Refused here for its bad key.)"""
    env = clean_env(
        tmp_path, FEDASYNC_WORKER__INGEST_URL="http://127.0.0.1:9", FEDASYNC_WORKER__KEY="ab"
    )
    result = run([sys.executable, "-m", "fedasync.services.worker"], env, tmp_path)
    line = assert_one_line(result, "FEDASYNC_WORKER__KEY")
    assert "Redis" not in line


@pytest.mark.parametrize(
    ("service", "name", "value"),
    [
        ("control", "FEDASYNC_CONTROL__DISABLED_RULES", "lag"),
        ("aggregator", "FEDASYNC_TASK__PARAMS", "hidden=64"),
    ],
)
def test_a_json_setting_that_is_not_json_stops_a_service_in_one_line(
    service: str, name: str, value: str, tmp_path: Path
) -> None:
    env = clean_env(tmp_path, FEDASYNC_REDIS__URL="redis://127.0.0.1:9/0", **{name: value})
    result = run([sys.executable, "-m", f"fedasync.services.{service}"], env, tmp_path)
    assert_one_line(result, f"{service}: invalid settings: {name}: not JSON: ")
