"""Each preset runs end to end, shrunk to a few devices and a short budget.

The full-size runs (100 devices, hours of simulated time) are in docs/experiments.md; here
only the plumbing of each preset's data split and algorithms is exercised.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.sim.config import build, merge
from fedasync.sim.presets import PRESETS, preset_data
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary
from tests.sim.helpers import preset_for_tests


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs_when_shrunk(name: str) -> None:
    shrunk: dict[str, Any] = {
        "fleet": {"devices": 12},
        "budget": {"max_updates": 30, "max_seconds": 1800},
    }
    if preset_data(name)["task"]["name"] == "digits":
        shrunk["task"] = {"params": {"hidden": 8}}
    data = merge(preset_for_tests(name), shrunk)
    sim = simulate(build(data))
    summary = build_summary(sim)
    assert list(summary["algorithms"]) == [a["name"] for a in data["algorithms"]]
    for result in summary["algorithms"].values():
        assert result["ended_by"] in ("max_updates", "max_seconds")
        assert result["updates"]["received"] > 0
        assert 0.0 <= result["final"]["score"] <= 1.0
    if name == "rare-class-dropped":
        slow = set(summary["fleet"]["slow_devices"])
        holders = {
            sim.world.client_ids[d] for d, data_ in enumerate(sim.world.device_data) if 8 in data_.y
        }
        assert holders == slow
