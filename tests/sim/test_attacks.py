"""Malicious devices in the simulator (sim/attacks.py, learning/backdoor.py) and Zeno++ against
them: each attack's transformation exact, seeded attackers, and the defence's effect on a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedasync.learning.backdoor import Trigger
from fedasync.learning.dataset import Dataset
from fedasync.sim.attacks import attacked, malicious_devices, noise, scaled, sign_flipped
from fedasync.sim.config import AttackConfig, ConfigError, build
from fedasync.sim.multiseed import aggregate, configs_for, run_seeds, tables
from fedasync.sim.report import attack_section
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary, dumps
from fedasync.sim.world import build_world
from tests.sim.helpers import config

BASE = np.array([1.0, -2.0, 0.5], np.float32)
TRAINED = np.array([1.5, -2.5, 0.5], np.float32)  # Δ = (0.5, −0.5, 0)


def test_a_sign_flip_sends_the_base_minus_the_honest_delta() -> None:
    assert sign_flipped(BASE, TRAINED).tolist() == [0.5, -1.5, 0.5]
    assert sign_flipped(BASE, TRAINED).dtype == np.float32


def test_scaling_multiplies_the_honest_delta() -> None:
    assert scaled(BASE, TRAINED, 10.0).tolist() == [6.0, -7.0, 0.5]


def test_noise_replaces_the_delta_with_the_streams_gaussian_draws() -> None:
    expected = BASE.astype(np.float64) + np.random.default_rng(7).normal(0.0, 2.0, 3)
    sent = noise(BASE, 2.0, np.random.default_rng(7))
    assert sent.tobytes() == expected.astype(np.float32).tobytes()


def test_the_dispatcher_applies_the_configured_attack_and_the_backdoor_sends_its_training() -> None:
    rng = np.random.default_rng(0)
    flip = AttackConfig(kind="sign_flip")
    assert attacked(flip, BASE, TRAINED, rng).tolist() == [0.5, -1.5, 0.5]
    assert attacked(AttackConfig(kind="scale", factor=-1.0), BASE, TRAINED, rng).tolist() == [
        0.5,
        -1.5,
        0.5,
    ]
    assert attacked(AttackConfig(kind="backdoor"), BASE, TRAINED, rng) is TRAINED


def test_the_attackers_are_a_seeded_share_of_the_fleet() -> None:
    first = malicious_devices(50, 0.2, np.random.default_rng(4))
    assert len(first) == 10
    assert all(0 <= d < 50 for d in first)
    assert malicious_devices(50, 0.2, np.random.default_rng(4)) == first
    assert len(malicious_devices(3, 0.01, np.random.default_rng(4))) == 1


def test_the_trigger_stamps_the_last_features_and_relabels_a_share() -> None:
    trigger = Trigger(target=3, size=2, value=1.0)
    data = Dataset(np.zeros((4, 5)), np.array([0, 1, 2, 3]))
    stamped = trigger.stamp(data.X)
    assert stamped[:, -2:].tolist() == [[1.0, 1.0]] * 4
    assert not stamped[:, :-2].any()
    assert not data.X.any()  # a copy
    poisoned = trigger.poison(data, 0.5, np.random.default_rng(0))
    changed = np.flatnonzero(poisoned.X[:, -1] == 1.0)
    assert len(changed) == 2
    assert (poisoned.y[changed] == 3).all()
    test = trigger.test_set(data)
    assert test.y.tolist() == [3, 3, 3]
    assert (test.X[:, -2:] == 1.0).all()


DIGITS: dict[str, Any] = {
    "seed": 1,
    "task": {"name": "digits", "params": {"hidden": 32}},
    "training": {"epochs": 2, "lr": 0.1, "batch_size": 8},
    "fleet": {"devices": 50, "latency": {"kind": "lognormal", "median_s": 60.0, "sigma": 0.5}},
    "budget": {"max_updates": 400, "max_seconds": 1e9},
    "eval": {"interval_s": 600},
    "algorithms": [
        {"kind": "fedasync", "name": "plain"},
        {"kind": "fedasync", "name": "zeno", "zeno_margin": 0.01},
    ],
}


def test_zeno_ends_more_accurate_than_plain_fedasync_with_a_fifth_of_sign_flippers() -> None:
    summary = build_summary(simulate(build({**DIGITS, "attack": {"kind": "sign_flip"}})))
    plain, zeno = summary["algorithms"]["plain"], summary["algorithms"]["zeno"]
    assert zeno["attack"]["malicious_devices"] == 10
    assert zeno["attack"]["malicious_rejected_by_reason"]["zeno"] > 0
    assert plain["attack"]["malicious_rejected_by_reason"] == {}
    assert zeno["attack"]["malicious_acceptance"] < plain["attack"]["malicious_acceptance"]
    assert zeno["final"]["score"] > plain["final"]["score"]


def test_a_backdoor_run_reports_its_success_and_is_deterministic() -> None:
    data = {
        **DIGITS,
        "budget": {"max_updates": 200, "max_seconds": 1e9},
        "algorithms": [{"kind": "fedasync"}, {"kind": "fedavg", "clients_per_round": 10}],
        "attack": {"kind": "backdoor", "share": 0.2, "target": 0},
    }
    first = build_summary(simulate(build(data)))
    for result in first["algorithms"].values():
        assert 0.0 <= result["attack"]["backdoor_success"] <= 1.0
    assert dumps(build_summary(simulate(build(data)))) == dumps(first)


def test_without_an_attack_the_summary_has_no_attack_section_nor_zeno_keys() -> None:
    summary = build_summary(simulate(config()))
    assert "attack" not in summary["config"]
    assert "validation" not in summary["config"]
    assert not any(k.startswith("zeno") for k in summary["config"]["algorithms"][0])
    assert "attack" not in summary["algorithms"]["fedasync"]


def test_zeno_on_a_buffered_mode_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="zeno_margin"):
        config(algorithms=[{"kind": "fedbuff", "zeno_margin": 0.1}])


def test_zeno_with_a_task_without_gradients_is_a_config_error() -> None:
    cfg = config(
        task={"name": "tests.unit.test_zeno:NoGradientTask", "params": {"samples": 100}},
        algorithms=[{"kind": "fedasync", "zeno_margin": 0.1}],
    )
    with pytest.raises(ConfigError, match="does not compute loss gradients"):
        build_world(cfg)


def test_the_report_has_an_attack_table_only_when_there_is_an_attack() -> None:
    assert attack_section(build_summary(simulate(config()))) == []
    attacked_run = build_summary(
        simulate(
            config(
                attack={"kind": "sign_flip", "share": 0.5},
                algorithms=[{"kind": "fedasync", "tau_max": 3, "zeno_margin": 0.0}],
            )
        )
    )
    lines = attack_section(attacked_run)
    assert lines[0] == "## Attack: `sign_flip`, 50% of the devices"
    [row] = [line for line in lines if line.startswith("| fedasync |")]
    at = attacked_run["algorithms"]["fedasync"]["attack"]
    assert f"| {at['malicious_applied']} / {at['malicious_submitted']} |" in row


def test_the_seeds_table_shows_the_attack_over_seeds(tmp_path: Path) -> None:
    attacked_config = config(
        attack={"kind": "noise", "share": 0.5},
        algorithms=[{"kind": "fedasync", "tau_max": 3}],
    )
    runs = run_seeds(configs_for(attacked_config, 2), tmp_path)
    result = aggregate(runs, attacked_config)
    share = result["algorithms"]["fedasync"]["attack"]["malicious_acceptance"]
    assert share["n"] == 2
    assert share["values"] == [
        r.summary["algorithms"]["fedasync"]["attack"]["malicious_acceptance"] for r in runs
    ]
    assert "Attack `noise` by 50% of the devices:" in tables(result)
    assert "attack" not in aggregate(runs[:1], config())
