"""`fedasync up` as a user runs it: a child process of its own, its own private Redis.

The environment is stripped of FEDASYNC_ variables, so the run cannot lean on the Redis that
happens to run on this machine: `up` must start its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.shared import stream_entry

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}


def ignore_sigint() -> None:
    """What a job started with `nohup … &` from a non-interactive shell inherits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def up(
    out: Path, *options: str, env: dict[str, str] | None = None, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """`fedasync up` in a process group of its own, as a shell starts a foreground job.

    SIGINT's disposition is set for the child either way, so the test does not depend on how the
    shell that runs the test suite treats it.
    """
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedasync.services.commands.up",
            "--no-live",
            "--out",
            str(out),
            *options,
        ],
        cwd=ROOT,
        env=clean_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=ignore_sigint if sigint_ignored else default_sigint,
    )


def children(pid: int) -> set[int]:
    """Direct children of `pid`, from /proc (Linux)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(p) for p in text)
    return found


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """`up` processes a test started: killed with their session if still running, and their
    output pipe closed, so a test that failed or timed out leaks neither a process nor an open
    file (whose ResourceWarning would otherwise surface later, in an unrelated test)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # `up` leads its session (start_new_session)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_up_trains_to_its_budget_and_writes_the_run_folder(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "run"
    process = up(out, "--devices", "3", "--profile", "none", "--max-updates", "60")
    processes.append(process)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    assert "dashboard" in output
    assert "private redis-server" in output
    assert "final test accuracy" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended_by"] == "max_updates"
    assert summary["version"] == 60
    assert summary["final"]["version"] == 60  # the evaluator scored the final version
    assert summary["final"]["accuracy"] > 0.5  # digits: chance is 0.1
    assert len(summary["final"]["per_class"]) == 10
    assert summary["updates"]["applied"] == 60
    assert summary["problems"] == []
    ledger_lines = (out / "ledger.jsonl").read_text().splitlines()
    assert len(ledger_lines) == summary["updates"]["decided"]
    for name in ("accuracy.png", "tau.png", "alpha.png", "acceptance.png", "evaluations.csv"):
        assert (out / name).stat().st_size > 0, name
    assert {p.name for p in (out / "logs").iterdir()} >= {
        "aggregator.log",
        "snapshot.log",
        "control.log",
        "evaluator.log",
        "worker-0.log",
        "worker-2.log",
    }


def test_up_runs_the_memory_mode_on_a_rare_class_partition_and_its_ledger_verifies(
    tmp_path: Path,
    processes: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fedasync up --mode memory` on digits, class 8 only on the slowest of 10 devices (its
    profile's largest median, as in the simulator): every device's updates are applied, one
    version per K = 10 of them, and `ledger verify --run` replays the run folder, the memory
    of every device included."""
    out = tmp_path / "run"
    options = ("--mode", "memory", "--partition", "rare_class_on_slow", "--rare-class", "8")
    process = up(out, *options, "--task", "digits", "--devices", "10", "--max-updates", "200")
    processes.append(process)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["policy"]["mode"] == "memory"
    assert summary["settings"]["task"]["partition"] == "rare_class_on_slow"
    assert summary["updates"]["applied"] == 200
    assert summary["version"] == 20  # the memory preset's K = 10 updates a step
    assert len(summary["final"]["per_class"]) == 10
    assert all(c["applied"] > 0 for c in summary["clients"])  # the slow device's too
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    capsys.readouterr()
    assert main(["ledger", "verify", "--run", str(out)]) == 0
    verified = capsys.readouterr().out
    assert "reproduced bit for bit" in verified
    assert "committed state: reproduced byte for byte, 10 remembered client deltas" in verified


def test_up_with_dp_ends_at_its_privacy_budget_shows_epsilon_and_verifies(
    tmp_path: Path,
    processes: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DP on with a privacy budget far below the update budget: the run closes on the privacy
    budget (exit 0, as for any budget), ε is in the progress lines, the summary and every
    ledger record, and `ledger verify --run` replays the noise with the run's secret."""
    out = tmp_path / "run"
    dp = (
        "--dp-clip",
        "1.0",
        "--dp-noise",
        "5.0",
        "--dp-population",
        "3",
        "--dp-participation",
        "1000",
    )
    process = up(
        out, "--devices", "3", "--profile", "none", *dp, "--privacy-budget", "3.0",
        "--max-updates", "400",
    )  # fmt: skip
    processes.append(process)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert re.search(r"ε [0-9.]+ conservative · [0-9.]+ sampled at δ 1e-05; budget 3", output)
    assert "differential privacy: clip C 1, noise z 5, δ 1e-05, privacy budget 3" in output
    assert "privacy spent ε" in output  # the summary's row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended_by"] == "privacy_budget"
    assert 0 < summary["updates"]["applied"] < 400
    privacy = summary["privacy"]
    assert (privacy["budget"], privacy["model"], privacy["clip"]) == (3.0, "conservative", 1.0)
    assert 0 < privacy["epsilon_conservative"] <= 3.0
    records = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert all("epsilon_conservative" in r and "epsilon_sampled" in r for r in records)
    assert records[-1]["epsilon_conservative"] == privacy["epsilon_conservative"]
    assert not any(r.get("reason") == "closed" and r.get("detail") != "privacy_budget"
                   for r in records)  # fmt: skip
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    capsys.readouterr()
    assert main(["ledger", "verify", "--run", str(out)]) == 0
    assert "reproduced bit for bit" in capsys.readouterr().out


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "nohup-shell"])
def test_ctrl_c_stops_every_child_writes_the_report_and_a_killed_worker_is_reported(
    tmp_path: Path, processes: list[subprocess.Popen[str]], sigint_ignored: bool
) -> None:
    """Also when `up` inherited an ignored SIGINT (issue 12, item 4): it sets its own handler."""
    out = tmp_path / "run"
    options = ("--devices", "3", "--task", "linear", "--max-updates", "1000000")
    process = up(out, *options, sigint_ignored=sigint_ignored)
    processes.append(process)
    assert process.stdout is not None
    for line in process.stdout:  # printed once every child has been started
        if "device processes started" in line:
            break
    pids = children(process.pid)
    assert len(pids) == 4 + 3 + 1  # services, workers, redis-server
    worker = next(
        p for p in pids if b"fedasync.services.worker" in Path(f"/proc/{p}/cmdline").read_bytes()
    )
    os.kill(worker, signal.SIGKILL)  # a crash the summary must report
    while alive(worker):  # dead (a zombie until `up` reaps it) before the Ctrl-C
        time.sleep(0.01)

    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output  # interrupted, and a worker died
    assert not [p for p in pids if alive(p)], output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended_by"] == "interrupted"
    problems = summary["problems"]
    assert any("crashed with exit code -9" in problem for problem in problems), problems


def test_a_fleet_that_all_died_ends_the_run_as_a_failure_with_each_crash_reported(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "run"
    options = ("--devices", "2", "--task", "linear", "--max-updates", "1000000")
    process = up(out, *options)
    processes.append(process)
    assert process.stdout is not None
    for line in process.stdout:
        if "device processes started" in line:
            break
    workers = [
        p
        for p in children(process.pid)
        if b"fedasync.services.worker" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(workers) == 2
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
    output, _ = process.communicate(timeout=240)  # `up` ends the run on its own
    assert process.returncode == 1, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended_by"] == "failed"
    problems = summary["problems"]
    assert sum("crashed with exit code -9" in problem for problem in problems) == 2, problems
    assert "every worker stopped before training was done" in problems, problems


def test_secure_devices_sign_and_publish_through_ingest(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "run"
    options = ("--secure", "--devices", "2", "--task", "linear", "--max-updates", "30")
    process = up(out, *options, "--profile", "none")
    processes.append(process)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["auth"]["required"] is True
    assert summary["updates"]["applied"] == 30
    assert summary["updates"]["dead_letters"] == 0
    server = RedisServer(out / "redis")  # the run's Redis, restarted from its AOF
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        entries = client.xrange("{fedasync}:updates")
        client.close()
    finally:
        server.stop()
    assert entries
    for _, fields in entries:  # built by the ingest service: signer, signing time, signature
        assert stream_entry.message_of(fields)
        assert stream_entry.proof_of(fields).client_id in ("device-0", "device-1")


def test_a_run_folder_with_contents_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "used"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    process = up(out, "--devices", "1")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2, output
    assert "is not empty" in output
    assert (out / "summary.json").read_text() == "{}"


def test_a_service_that_stops_is_a_failure_and_stray_settings_stay_out(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "run"
    options = ("--devices", "1", "--task", "linear", "--profile", "none")
    env = clean_env() | {"FEDASYNC_WORKER__KEY": "ab" * 32}  # meant for some other device
    process = up(out, *options, "--max-updates", "1000000", env=env)
    processes.append(process)
    assert process.stdout is not None
    for line in process.stdout:  # progress lines: wait until updates are being applied
        if re.search(r"applied [1-9]", line):
            break
    aggregator = next(
        p
        for p in children(process.pid)
        if b"fedasync.services.aggregator" in Path(f"/proc/{p}/cmdline").read_bytes()
    )
    os.kill(aggregator, signal.SIGTERM)  # someone else stops it: it drains and exits 0
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    summary = json.loads((out / "summary.json").read_text())
    assert any("aggregator stopped (exit code 0)" in p for p in summary["problems"])
    # the caller's FEDASYNC_WORKER__KEY did not reach the worker: its updates were applied
    assert summary["updates"]["applied"] > 0
    assert summary["updates"]["dead_letters"] == 0


def test_up_three_runs_trains_each_to_its_budget_and_each_ledger_verifies(
    tmp_path: Path,
    processes: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fedasync up --runs 3`: one Redis, one snapshot and control service, an aggregator, an
    evaluator and two devices per run; each run ends on its own budget, has its own folder, and
    `ledger verify --run <out>/<run>` replays each from the shared Redis."""
    out = tmp_path / "runs"
    process = up(out, "--runs", "3", "--devices", "2", "--profile", "none", "--max-updates", "30")
    processes.append(process)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "fedasync up: 3 runs" in output
    runs = ["fedasync", "fedasync-2", "fedasync-3"]
    for run in runs:
        summary = json.loads((out / run / "summary.json").read_text())
        assert summary["run"] == run
        assert summary["ended_by"] == "max_updates"
        assert summary["updates"]["applied"] == 30
        assert summary["final"]["version"] == summary["version"] == 30
        assert summary["problems"] == []
        assert {p.name for p in (out / "logs").iterdir()} >= {
            f"{run}.aggregator.log",
            f"{run}.evaluator.log",
            f"{run}.worker-0.log",
        }
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    for run in runs:
        capsys.readouterr()
        assert main(["ledger", "verify", "--run", str(out / run)]) == 0
        assert "reproduced bit for bit" in capsys.readouterr().out
