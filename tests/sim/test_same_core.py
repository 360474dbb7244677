"""The simulator decides through the core: replaying what it submitted gives the same decisions.

Every update the simulator submitted is recorded with the decision it got; a fresh
AggregationState fed the same updates under the same policy (as the aggregator service would
be) must decide identically and end with bit-identical weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedasync.learning.linear import LinearRegression
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Decision
from fedasync.shared.update import Update
from fedasync.sim.runner import simulate
from fedasync.sim.world import build_world
from tests.sim.helpers import config

FLEET = {"devices": 8, "latency": {"kind": "longtail"}, "dropout": 0.15}


@pytest.mark.parametrize(
    "algorithm",
    [
        {"kind": "fedasync", "decay": "hinge", "hinge_b": 1, "tau_max": 4},
        {"kind": "fedasync", "decay": "progress", "tau_max": 6},
        {"kind": "fedbuff", "buffer_size": 3, "server_lr": 0.8, "tau_max": 6},
    ],
    ids=["fedasync-hinge", "fedasync-progress", "fedbuff"],
)
def test_replaying_the_submitted_updates_reproduces_every_decision(
    algorithm: dict[str, Any],
) -> None:
    cfg = config(fleet=FLEET, algorithms=[algorithm], budget={"max_updates": 80})
    world = build_world(cfg)
    submitted: list[tuple[Update, Decision]] = []
    sim = simulate(cfg, world=world, on_decision=lambda u, d: submitted.append((u, d)))
    result = sim.results[0]
    outcomes = {d.outcome.value for _, d in submitted}
    assert {"applied", "dropped"} <= outcomes  # the run exercised mixing and dropping

    replay = AggregationState(world.init_weights.copy(), world.task.layout)
    policy = cfg.algorithms[0].policy(result.settings["tau_max"])  # type: ignore[union-attr]
    assert policy.to_dict() == result.settings
    for update, decision in submitted:
        assert replay.apply(update, policy).to_dict() == decision.to_dict()
    assert replay.weights_view().tobytes() == result.weights.tobytes()
    assert replay.counters == result.counters


class ScribblingTask(LinearRegression):
    """A device that writes into the model it was given after training on a copy of it."""

    def train(self, weights: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        out = super().train(weights, *args, **kwargs)
        weights += 1000.0
        return out


def test_a_device_scribbling_on_its_snapshot_cannot_change_the_server_model() -> None:
    cfg = config(fleet=FLEET, budget={"max_updates": 40})
    clean = simulate(cfg).results[0]
    world = build_world(cfg)
    object.__setattr__(world, "task", ScribblingTask(samples=800))
    scribbled = simulate(cfg, world=world).results[0]
    assert scribbled.weights.tobytes() == clean.weights.tobytes()
