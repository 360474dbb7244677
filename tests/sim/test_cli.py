"""`fedasync simulate` and `advise`, via the parser of services/commands/cli.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.helpers import run_cli

run = run_cli


def test_simulate_writes_summary_and_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(
        '[task]\nname = "linear"\nparams = {samples = 400}\n[fleet]\ndevices = 4\n'
        '[budget]\nmax_updates = 20\n[[algorithms]]\nkind = "fedasync"\n'
        '[[algorithms]]\nkind = "fedavg"\nclients_per_round = 2\n'
    )
    out = tmp_path / "out"
    argv = ["simulate", "--config", str(config), "--out", str(out), "--seed", "4"]
    assert run([*argv, "--no-plots", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 4
    assert set(summary["algorithms"]) == {"fedasync", "fedavg"}
    assert (out / "curves.csv").read_text().startswith("algorithm,time_s,updates,version,loss")
    printed = capsys.readouterr().out
    assert "fedasync: final" in printed
    assert "ended by max_updates" in printed


def test_simulate_lists_and_shows_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["simulate", "--list-presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(
        [
            "byzantine",
            "dp-tradeoff",
            "fedbuff-vs-fedasync",
            "iid-longtail",
            "million-devices",
            "noniid-jitter",
            "rare-class-dropped",
            "rare-class-fair",
            "rate-spike",
        ]
    )
    assert all(len(line.split()) > 3 for line in lines)  # one line of description each
    described = {line.split()[0]: line for line in lines}
    assert "FedAsync, FedBuff (K = 10) and FedAvg" in described["fedbuff-vs-fedasync"]
    assert run(["simulate", "--preset", "noniid-jitter", "--show-config"]) == 0
    assert 'partition = "shards"' in capsys.readouterr().out


def test_bad_input_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[algorithms]]\nkind = "fedasync"\ngamma = -1\n')
    assert run(["simulate", "--config", str(bad), "--quiet"]) == 2
    assert "gamma" in capsys.readouterr().err
    assert run(["advise"]) == 2
    assert "--trace" in capsys.readouterr().err


def test_advise_from_a_preset_and_from_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["advise", "--preset", "iid-longtail", "--tau-max", "10"]) == 0
    text = capsys.readouterr().out
    assert "expected tau of the slowest devices" in text
    assert "permanently dropped" in text
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "device,duration_s\n" + "".join(f"d{i},{10 + 90 * (i == 9)}\n" for i in range(10))
    )
    assert run(["advise", "--trace", str(trace), "--rate", "1", "--json", "--quantile", "0.9"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice["slow_latency_s"] == 10.0
    assert advice["expected_tau_slowest"] == 10.0
    assert run(["advise", "--trace", str(trace), "--rate", "1", "--tau-max", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["permanently_dropped"] == [9]


def test_a_bad_policy_value_names_the_config_key_and_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[algorithms]]\nkind = "fedasync"\ntau_max = 10\n'
        '[[algorithms]]\nkind = "fedbuff"\ngamma = -1\ntau_max = "never"\n'
    )
    assert run(["simulate", "--config", str(bad), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "fedasync: invalid simulation config:",
        "  algorithms.1.gamma = -1: allowed (0, 10]",
        '  algorithms.1.tau_max = "never": allowed integer in [0, 1000] or "auto"',
    ]


def test_seeds_runs_each_seed_and_writes_mean_and_sd_the_same_with_two_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(
        '[task]\nname = "linear"\nparams = {samples = 400}\n[fleet]\ndevices = 4\n'
        '[budget]\nmax_updates = 20\n[eval]\ntarget = 0.5\n[[algorithms]]\nkind = "memory"\n'
        'buffer_size = 2\n[[algorithms]]\nkind = "fedavg"\nclients_per_round = 2\n'
    )
    outs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        argv = ["simulate", "--config", str(config), "--out", str(out), "--seed", "4"]
        assert run([*argv, "--seeds", "3", "--jobs", str(jobs), "--no-plots", "--quiet"]) == 0
        outs[jobs] = out
    printed = capsys.readouterr().out
    assert "over 3 seeds (4, 5, 6)" in printed
    result = json.loads((outs[1] / "seeds.json").read_text())
    assert result["seeds"] == [4, 5, 6]
    memory = result["algorithms"]["memory"]
    assert len(memory["final"]["values"]) == 3
    each = [
        json.loads((outs[1] / f"seed{s}" / "summary.json").read_text())["algorithms"]["memory"]
        for s in (4, 5, 6)
    ]
    assert memory["final"]["values"] == [a["final"]["score"] for a in each]
    assert memory["final"]["mean"] == pytest.approx(sum(a["final"]["score"] for a in each) / 3)
    assert (outs[1] / "per_class_time.png").stat().st_size > 10_000
    assert (outs[1] / "seeds.json").read_bytes() == (outs[2] / "seeds.json").read_bytes()
    assert (outs[1] / "seeds.md").read_text() == (outs[2] / "seeds.md").read_text()


def test_a_dp_simulation_prints_none_of_the_accountants_convergence_warnings(
    tmp_path: Path,
) -> None:
    """At z = 1, q = 0.2 dp-accounting warns (through absl) for each fractional RDP order that
    does not converge; `fedasync` holds them back (services/runtime/logs.py), in its own process
    and in the `--jobs` workers, which account each seed's ε."""
    config = tmp_path / "dp.toml"
    config.write_text(
        '[task]\nname = "linear"\nparams = {samples = 400}\n[fleet]\ndevices = 5\n'
        '[budget]\nmax_updates = 20\n[[algorithms]]\nkind = "fedasync"\ndp_clip = 0.5\n'
        "dp_noise = 1.0\ndp_population = 5\ndp_participation = 12\n"
    )
    for extra in ([], ["--seeds", "2", "--jobs", "2"]):
        out = tmp_path / f"out{len(extra)}"
        argv = ["simulate", "--config", str(config), "--out", str(out), "--no-plots", "--quiet"]
        result = subprocess.run(
            [sys.executable, "-m", "fedasync.services.commands.cli", *argv, *extra],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "failed to converge" not in result.stderr
        assert "epsilon" in (out / ("seed0" if extra else "") / "summary.json").read_text()
