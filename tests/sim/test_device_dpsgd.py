"""DP-SGD on simulated devices: each device's own accountant across its runs, the fleet's worst ε
in the summary, and summaries without DP-SGD unchanged."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from opacus.accountants import RDPAccountant

from fedasync.sim.config import ConfigError
from fedasync.sim.report import device_privacy_section
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary, dumps
from tests.sim.helpers import LINEAR, config

DPSGD = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5}
BATCH, EPOCHS = 16, 1
DIGITS: dict[str, Any] = {
    **LINEAR,
    "name": "dp-digits",
    "seed": 7,
    "task": {"name": "digits", "params": {"hidden": 8}},
    "fleet": {"devices": 4, "latency": {"kind": "fixed", "medians_s": [10, 20, 30, 40]}},
    "training": {"epochs": EPOCHS, "batch_size": BATCH, "lr": 0.1},
    "budget": {"max_updates": 10, "max_seconds": 3600},
    "eval": {"interval_s": 60},
    "algorithms": [{"kind": "fedasync", "tau_max": 2}, {"kind": "fedavg", "clients_per_round": 2}],
}


def epsilon_after(samples: int, runs: int) -> float:
    """Opacus's RDP ε for `runs` runs of a device holding `samples` samples."""
    per_epoch = math.ceil(samples / BATCH)
    accountant = RDPAccountant()
    accountant.history = [(DPSGD["noise_multiplier"], 1 / per_epoch, runs * EPOCHS * per_epoch)]
    return float(accountant.get_epsilon(delta=DPSGD["delta"]))


@pytest.fixture(scope="module")
def private_summary() -> tuple[Any, dict[str, Any]]:
    sim = simulate(config(DIGITS, training={**DIGITS["training"], "dpsgd": DPSGD}))
    return sim, json.loads(dumps(build_summary(sim)))


def test_the_summary_gives_the_fleets_worst_device_epsilon_as_opacus_computes_it(
    private_summary: tuple[Any, dict[str, Any]],
) -> None:
    """Every run a device trains is decided at once (decide_s = 0), so a device's last report
    is the ε of all its runs; the worst of them is the summary's, for each algorithm."""
    sim, summary = private_summary
    sizes = sim.world.device_data.sizes()
    for result in sim.results:
        section = summary["algorithms"][result.name]["device_privacy"]
        trained = result.recorder.submitted if result.kind != "fedavg" else result.recorder.applied
        epsilons = {
            sim.world.client_ids[d]: epsilon_after(sizes[d], runs)
            for d, runs in enumerate(trained)
            if runs
        }
        assert section["worst_epsilon"] == max(epsilons.values()) > 0
        assert epsilons[section["client"]] == section["worst_epsilon"]  # ties: either device
        assert section["delta"] == DPSGD["delta"]
        assert section["devices_reporting"] == len(epsilons)


def test_the_config_in_the_summary_records_dpsgd(
    private_summary: tuple[Any, dict[str, Any]],
) -> None:
    _, summary = private_summary
    assert summary["config"]["training"]["dpsgd"] == DPSGD


def test_a_seeded_private_run_is_the_same_twice(
    private_summary: tuple[Any, dict[str, Any]],
) -> None:
    sim, summary = private_summary
    again = simulate(config(DIGITS, training={**DIGITS["training"], "dpsgd": DPSGD}))
    assert dumps(build_summary(again)) == dumps(summary)
    for first, second in zip(sim.results, again.results, strict=True):
        assert first.weights.tobytes() == second.weights.tobytes()


def test_without_dpsgd_the_summary_has_no_device_privacy_nor_dpsgd_key() -> None:
    summary = build_summary(simulate(config()))
    assert "dpsgd" not in summary["config"]["training"]
    assert all("device_privacy" not in a for a in summary["algorithms"].values())


def test_a_task_opacus_cannot_train_is_a_config_error_naming_the_fix() -> None:
    bad = {**DIGITS, "task": {"name": "tests.learning.torch_models:QuadrantTask"}}
    with pytest.raises(ConfigError, match=r"ModuleValidator\.fix"):
        simulate(config(bad, training={**DIGITS["training"], "dpsgd": DPSGD}))


def test_the_report_has_a_dpsgd_section_only_when_devices_trained_privately(
    private_summary: tuple[Any, dict[str, Any]],
) -> None:
    _, summary = private_summary
    lines = device_privacy_section(summary)
    assert lines[0] == "## DP-SGD on the devices"
    for name, algorithm in summary["algorithms"].items():
        worst = algorithm["device_privacy"]["worst_epsilon"]
        assert any(line.startswith(f"| {name} | {worst:.3f} |") for line in lines)
    assert device_privacy_section(build_summary(simulate(config()))) == []
