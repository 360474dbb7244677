"""Every bench under bench/ still runs: each at its smallest settings, its table printed.

A bench is part of the product (issue 25, item 6: `bench/fedbuff_flsim.py flsim` had stopped
running and nothing noticed). Each script is run as a user runs it, a child process of this
interpreter, with the arguments of `SMOKE` below, and must exit 0 and print the line its table
starts with. A new bench fails `test_every_bench_has_a_smoke_run` until it has an entry here.
The figures are not checked: at these sizes they mean nothing (speed belongs to the benches).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: modules in bench/ that benches import and nobody runs (machine.py: the commit and load line)
LIBRARIES = {"machine.py"}
BENCHES = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name not in LIBRARIES)


@dataclass(frozen=True)
class Smoke:
    #: the runs, in order; "{tmp}" is a fresh folder of the test's (a bench never writes the tree)
    runs: tuple[tuple[str, ...], ...]
    #: a line of the last run's table: what shows the bench measured something
    prints: str
    #: tools the bench needs that CI may lack (the test skips, naming them, without them)
    needs: tuple[str, ...] = ()
    #: called with the test's folder once every run is done: checks what the bench wrote there
    check: Callable[[Path], None] | None = None


def _runs_figures(tmp: Path) -> None:
    """bench/runs.py's JSON: every field there and sane (no figure judged: they are timings)."""
    train = json.loads((tmp / "train.json").read_text())
    rows = train["results"]
    assert len(rows) == train["runs"] == 2
    for row in rows:
        assert row["updates"] == train["budget"], row  # each run trained to its budget
        assert row["version"] >= 1, row
        assert row["verify"].startswith("OK"), row
        assert 0.0 <= row["accuracy"] <= 1.0, row
        assert 0 <= row["slot"] < 16384, row
        assert row["rate_before"] >= 0, row
        assert row["rate_after"] >= 0, row
    assert rows[0]["alone_accuracy"] is not None  # --alone 1: the first run again, by itself
    assert rows[0]["alone_updates"] == train["budget"]
    assert rows[1]["alone_accuracy"] is None
    kill = train["kill"]
    assert kill["run"] == rows[1]["run"]  # --kill-aggregator 2
    assert kill["last_exit"] == -9, kill  # the kill -9 happened, and was restarted once
    assert kill["restarts"] == 1, kill
    assert kill["pid_after"] != kill["pid"], kill
    assert kill["next_commit_s"] > 0, kill
    assert train["nproc"] >= 1
    assert len(train["load_average_end"]) == 3
    through = json.loads((tmp / "throughput.json").read_text())
    assert [row["primaries"] for row in through["rows"]] == [1, 2]
    for row in through["rows"]:
        assert row["updates_per_s"] > 0, row
        assert row["durable_replicas"] == 1, row  # durable mode, a cluster's default
        assert row["decided"] == [through["runs"] * through["updates_per_run"]], row
        assert row["bytes_per_run"] > 0, row


SMOKE: dict[str, Smoke] = {
    "aggregator.py": Smoke(
        (("--sizes", "1000", "--repeat", "1", "--fp16", "--claim-check"),), "ours/raw"
    ),
    # our side of each cell; Flower's side (`flower`) runs in Flower's virtualenv, as below
    "byzantine.py": Smoke(
        (("run", "--smoke", "--seeds", "1", "--cells", "backdoor-10%", "--out", "{tmp}"),),
        "| ours | fedbuff-krum |",
    ),
    "cli_startup.py": Smoke(
        (("--rounds", "1", "--commands", "ledger"),), "fedasync ledger export --help"
    ),
    "core.py": Smoke((("--sizes", "1000", "--updates", "20"),), "core/bare"),
    "dpsgd.py": Smoke((("--repeat", "1", "--updates", "4", "--devices", "3"),), "dp-sgd"),
    "durable.py": Smoke(
        (("--lag-ms", "0", "--publishers", "1", "--seconds", "0.5", "--rounds", "1"),),
        "| replica | XADD/s, durable off |",
    ),
    # FLSim's side runs in its own virtualenv (the bench's docstring), which CI does not build:
    # test_flsim_side_runs_on_flsim covers it where one is named, and the adapter's interface is
    # checked against the simulator's below, without FLSim
    "fedbuff_flsim.py": Smoke(
        (("ours", "--smoke", "--seeds", "0", "--out", "{tmp}"), ("table", "{tmp}")),
        "| issue | sgd | ours, after | 1 |",
    ),
    # Flower's side runs in its own virtualenv (the bench's docstring): test_flower_side_runs_on_
    # flower covers it where one is named; here our side of the same seam
    "flower_side.py": Smoke(
        (
            ("run", "--smoke", "--strategy", "ours", "--seeds", "0", "--out", "{tmp}"),
            ("table", "{tmp}"),
        ),
        "| fedbuff-vs-fedasync | fedavg-10of13 | none | ours | 1 |",
    ),
    "ingest_forged.py": Smoke(
        (
            (
                *("--parameters", "10000", "--seconds", "2", "--forged-mib", "8"),
                *("--forgers", "2", "--mode", "declared"),
            ),
        ),
        "genuine device:",
    ),
    "load.py": Smoke(
        (
            (
                *("--devices", "4", "--seconds", "3", "--warmup", "1", "--rate", "2"),
                *("--task", "linear", "--wait", "1", "--snapshot-workers", "1"),
                *("--out", "{tmp}/load.json"),
            ),
        ),
        "updates/s  fetches/s",
    ),
    "robust.py": Smoke((("--ks", "10", "--sizes", "1000", "--repeat", "1"),), "old/new same"),
    # both figures of many runs on a cluster, each at its smallest: two runs (a kill -9 of the
    # second's aggregator, the first trained alone again), then one and two primaries
    "runs.py": Smoke(
        (
            (
                *("train", "--primaries", "1", "--runs", "2", "--task", "linear"),
                *("--budget", "20", "--devices", "1", "--kill-aggregator", "2", "--window", "1"),
                *("--alone", "1", "--json", "{tmp}/train.json"),
            ),
            (
                *("throughput", "--primaries", "1", "2", "--runs", "2", "--size", "1000"),
                *("--updates", "10", "--repeat", "1", "--json", "{tmp}/throughput.json"),
            ),
        ),
        "| primaries | total updates/s | per run |",
        check=_runs_figures,
    ),
    "simulator.py": Smoke((("--updates", "10", "--devices", "3"),), "sim s/wall s"),
    "slow_clients.py": Smoke(
        (("--slow", "3", "--requests", "12", "--rounds", "1", "--header-timeout", "2"),),
        "ratio with/without",
    ),
    "snapshot.py": Smoke(
        (
            (
                *("--parameters", "1000", "--seconds", "1", "--rounds", "1"),
                *("--workers", "1", "--paths", "meta", "--connections", "2"),
            ),
        ),
        "req/s,",
        needs=("nginx", "wrk"),
    ),
    "soak.py": Smoke(
        (("--maxmemory-mb", "4", "--parameters", "1000", "--updates", "20"),),
        "exactly once: acknowledged",
    ),
    "suite_under_load.py": Smoke(
        (("--runs", "1", "--hogs", "1", "--", "tests/unit/test_staleness.py", "-q"),),
        "all green",
    ),
}


def _arguments(smoke: Smoke, tmp: Path) -> list[list[str]]:
    return [[a.replace("{tmp}", str(tmp)) for a in run] for run in smoke.runs]


def _run(python: str, bench: str, arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, str(ROOT / "bench" / bench), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


def test_every_bench_has_a_smoke_run() -> None:
    assert set(BENCHES) - set(SMOKE) == set(), "add the new bench's smallest settings to SMOKE"
    assert set(SMOKE) - set(BENCHES) == set(), "SMOKE names a bench that is gone"


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_runs_at_its_smallest_settings(bench: str, tmp_path: Path) -> None:
    smoke = SMOKE.get(bench)
    if smoke is None:
        pytest.fail(f"{bench} has no entry in SMOKE")
    missing = [tool for tool in smoke.needs if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{bench} needs {', '.join(missing)}, not on PATH (Debian's packages)")
    for arguments in _arguments(smoke, tmp_path):
        done = _run(sys.executable, bench, arguments)
        assert done.returncode == 0, f"{bench} {arguments}: exit {done.returncode}\n{done.stderr}"
    assert smoke.prints in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    if smoke.check is not None:
        smoke.check(tmp_path)


def test_flsim_side_runs_on_flsim(tmp_path: Path) -> None:
    """FLSim's server through our simulator, on FLSim itself: the same table as ours, seed 0."""
    python = os.environ.get("FLSIM_PYTHON")
    if not python:
        pytest.skip(
            "FLSim 0.1.0 lives in a virtualenv of its own (bench/fedbuff_flsim.py's docstring "
            "says how to make one); set FLSIM_PYTHON to its python to run this"
        )
    for arguments in (
        ["flsim", "--smoke", "--seeds", "0", "--out", str(tmp_path)],
        ["ours", "--smoke", "--seeds", "0", "--out", str(tmp_path)],
    ):
        side = python if arguments[0] == "flsim" else sys.executable
        done = _run(side, "fedbuff_flsim.py", arguments)
        assert done.returncode == 0, done.stderr
    table = _run(sys.executable, "fedbuff_flsim.py", ["table", str(tmp_path)]).stdout
    rows = [line.split(" | ")[4:] for line in table.splitlines() if "| issue | sgd |" in line]
    assert len(rows) == 2, table
    assert rows[0] == rows[1], table  # both servers, the same figures
    alone = ["alone", "--smoke", "--seeds", "0", "--concurrency", "10", "--out", str(tmp_path)]
    done = _run(python, "fedbuff_flsim.py", alone)  # FLSim's own trainer and arrivals
    assert done.returncode == 0, done.stderr
    table = _run(sys.executable, "fedbuff_flsim.py", ["table", str(tmp_path)]).stdout
    assert "FLSim 0.1.0 alone: its AsyncTrainer, Poisson starts, ~10 at once" in table


def test_flower_side_runs_on_flower(tmp_path: Path) -> None:
    """Flower's FedAvg through our synchronous rounds gives our FedAvg's figures (seed 0), and
    its DP, median and Krum strategies run on the same seam."""
    python = os.environ.get("FLOWER_PYTHON")
    if not python:
        pytest.skip(
            "flwr 1.42 lives in a virtualenv of its own (bench/flower_side.py's docstring says "
            "how to make one); set FLOWER_PYTHON to its python to run this"
        )
    smoke = ["run", "--smoke", "--seeds", "0", "--out", str(tmp_path)]
    done = _run(python, "flower_side.py", [*smoke, "--strategy", "fedavg", "ours"])
    assert done.returncode == 0, done.stderr
    table = _run(sys.executable, "flower_side.py", ["table", str(tmp_path)]).stdout
    rows = [line.split(" | ")[4:] for line in table.splitlines() if "| fedavg-10of13 |" in line]
    assert len(rows) == 2, table
    assert rows[0] == rows[1], table  # Flower's FedAvg and ours: the same figures
    others = ["--strategy", "dp-fixed", "fedmedian", "krum", "--dp-clip", "1", "--dp-noise", "1"]
    done = _run(python, "flower_side.py", [*smoke, *others])
    assert done.returncode == 0, done.stderr
    table = _run(sys.executable, "flower_side.py", ["table", str(tmp_path)]).stdout
    for strategy in ("dp-fixed", "fedmedian", "krum"):
        assert f"| Flower 1.42 {strategy} | 1 |" in table, table


def _attributes_read(path: Path, owner: str) -> set[str]:
    """Names X in `self.<owner>.X` anywhere in the module."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == owner
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }


def _attributes_of_calls(path: Path, method: str) -> set[str]:
    """Names X in `self.<method>(...).X` anywhere in the module."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == method
        and isinstance(node.value.func.value, ast.Name)
        and node.value.func.value.id == "self"
    }


def _attributes_defined(path: Path, cls: str) -> set[str]:
    """Methods and properties of class `cls`, and the `self.X` it assigns."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    names = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    names.add(t.attr)
    return names


def test_flsim_server_offers_everything_the_simulator_asks_of_its_server() -> None:
    """Without FLSim: the bench's FlsimServer stands in for `AsyncRun.state`, so it must have
    every attribute the simulator reads there (it lacked `drops_unread` once, unnoticed), as
    `self.state.X` or through `self._decider(device).X` (the state itself, without a tree)."""
    module = ROOT / "sim" / "asynchronous.py"
    asked = _attributes_read(module, "state") | _attributes_of_calls(module, "_decider")
    assert {"apply", "drops_unread", "decide_unread", "weights_view", "version"} <= asked
    offered = _attributes_defined(ROOT / "bench" / "fedbuff_flsim.py", "FlsimServer")
    assert asked - offered == set()


def test_simulator_bench_grows_a_config_file(tmp_path: Path) -> None:
    """`bench/simulator.py --config` (issue 29): any config file's growth, one row per fleet
    size with ratios to the first, the machine line first and last, and each row's profile
    kept with `--profile`; run on both of bench/configs/ (neither is a preset), tiny."""
    from fedasync.sim.presets import PRESETS

    configs = sorted((ROOT / "bench" / "configs").glob("*.toml"))
    assert [c.stem for c in configs] == ["fedasync-longtail", "fedbuff-intermittent"]
    assert not {c.stem for c in configs} & set(PRESETS)
    arguments = [a for c in configs for a in ("--config", str(c))]
    sizes = ["--devices", "20", "40", "--updates", "30", "--profile", str(tmp_path)]
    done = _run(sys.executable, "simulator.py", [*arguments, *sizes])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for machine_line in (lines[0], lines[-1]):
        assert machine_line.startswith("commit "), done.stdout
        assert "load average" in machine_line, done.stdout
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("|  ")]
    assert len(rows) == 2 * 3, done.stdout  # per config: the header and a row per size
    for header, first, second in (rows[0:3], rows[3:6]):
        assert [h.strip() for h in header][:3] == ["devices", "wall s", "× first"]
        assert [first[0].strip(), second[0].strip()] == ["20", "40"]
        assert first[2].strip() == "1.00"  # the first row is the reference of the ratios
        assert int(first[7].replace(",", "")) == int(second[7].replace(",", "")) == 30
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [f"{c.stem}-{n}.pstats" for c in configs for n in (20, 40)]
