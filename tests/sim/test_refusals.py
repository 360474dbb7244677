"""Every algorithm refuses a bad update as the core does, and a run that only refuses ends.

A task whose `train` returns one value too many used to be averaged by FedAvg six times and
crash it a round later; FedAsync and FedBuff refused every update and ran silently to their
budget. Now each refuses with the core's reason and detail (shared/validation.py) and ends as
"stalled" after STALL_REFUSALS refusals with none applied (sim/stall.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedasync.learning.evaluation import Evaluation
from fedasync.learning.task import Dataset, Task
from fedasync.learning.tasks import get_task
from fedasync.shared.decision import Decision, Outcome
from fedasync.sim.asynchronous import run_async
from fedasync.sim.result import RunResult
from fedasync.sim.stall import STALL_REFUSALS, Stall
from fedasync.sim.synchronous import run_sync
from fedasync.sim.world import World, build_world
from tests.sim.helpers import config, run_cli

ALGORITHMS = [
    {"kind": "fedavg", "clients_per_round": 3},
    {"kind": "fedasync", "tau_max": 3},
    {"kind": "fedbuff", "buffer_size": 3, "tau_max": 10},
]


class Broken(Task):
    """The linear task, with `train` returning one value too many, or NaN every `nan_every`
    trainings (counted in call order, which the simulator makes deterministic)."""

    def __init__(self, extra: int = 1, nan_every: int = 0) -> None:
        self.inner = get_task("linear", samples=800)
        self.name, self.layout = "broken", self.inner.layout
        self.num_classes, self.suggested = self.inner.num_classes, self.inner.suggested
        self.extra, self.nan_every, self.calls = extra, nan_every, 0

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        return self.inner.init_weights(rng)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        return self.inner.dataset(rng)

    def train(
        self, weights: np.ndarray, data: Dataset, rng: np.random.Generator, **params: Any
    ) -> tuple[np.ndarray, dict[str, float]]:
        new, metrics = self.inner.train(weights, data, rng, **params)
        self.calls += 1
        if self.nan_every and self.calls % self.nan_every == 0:
            new = np.full_like(new, np.nan)
        return np.concatenate([new, np.zeros(self.extra, np.float32)]), metrics

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        return self.inner.evaluate(weights, data)


def world_with(task: Task, algorithm: dict[str, Any], **budget: Any) -> World:
    sim = config(algorithms=[algorithm], budget={"max_seconds": 6 * 3600, **budget})
    return dataclasses.replace(build_world(sim), task=task)


def run(world: World) -> RunResult:
    algorithm = world.config.algorithms[0]
    if algorithm.kind == "fedavg":
        return run_sync(world, 0)
    return run_async(world, 0, algorithm.policy(advised_tau_max=3))  # type: ignore[union-attr]


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a["kind"])
def test_every_algorithm_refuses_a_wrong_size_update_with_the_cores_reason_and_stops(
    algorithm: dict[str, Any],
) -> None:
    world = world_with(Broken(extra=1), algorithm)
    size = world.task.layout.size
    result = run(world)  # FedAvg raised ValueError here, a round after averaging bad models
    assert result.recorder.updates_applied == 0
    outcomes = {(d.outcome, d.reason) for d in result.recorder.decisions}
    assert outcomes == {("rejected", "shape_mismatch")}
    assert np.array_equal(result.weights, world.init_weights)  # nothing was averaged in
    assert result.ended_by == "stalled"
    assert result.end_s < 6 * 3600  # not the whole simulated budget
    assert result.stalled == (
        f"{len(result.recorder.decisions)} updates refused and none applied since: "
        f"{len(result.recorder.decisions)} rejected shape_mismatch "
        f"(last: shape ({size + 1},), expected ({size},))"
    )
    assert STALL_REFUSALS <= len(result.recorder.decisions) < STALL_REFUSALS + 3


def test_fedavg_leaves_a_non_finite_result_out_and_averages_the_others() -> None:
    class NanSometimes(Broken):
        def train(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, dict[str, float]]:
            new, metrics = super().train(*args, **kwargs)
            return new[: -self.extra], metrics  # the right size, NaN every third training

    world = world_with(NanSometimes(nan_every=3), ALGORITHMS[0], max_updates=30)
    result = run_sync(world, 0)
    rejected = [d for d in result.recorder.decisions if d.outcome == "rejected"]
    assert rejected
    assert {d.reason for d in rejected} == {"non_finite"}
    assert result.ended_by == "max_updates"
    assert result.recorder.updates_applied >= 30
    assert np.isfinite(result.weights).all()
    # a refused result was submitted (the round counted it) but not applied
    assert sum(result.recorder.submitted) == sum(result.recorder.applied) + len(rejected) + sum(
        result.recorder.discarded
    )


def test_a_stall_is_the_same_decision_in_every_run() -> None:
    first, second = (run(world_with(Broken(), ALGORITHMS[1])) for _ in range(2))
    assert (first.end_s, len(first.recorder.decisions)) == (
        second.end_s,
        len(second.recorder.decisions),
    )


def _decision(outcome: Outcome, reason: str | None = None) -> Decision:
    return Decision(outcome, "u", "c", 0, 0, 0, reason=reason, detail=reason or "")


def test_drops_neither_stall_a_run_nor_break_a_streak_and_an_applied_update_ends_it() -> None:
    stall = Stall(limit=3)
    for _ in range(1000):  # a burst of stale updates is normal: it ends by itself
        stall.decided(_decision(Outcome.DROPPED, "stale"))
    assert not stall.stalled
    stall.decided(_decision(Outcome.REJECTED, "non_finite"))
    stall.decided(_decision(Outcome.DROPPED, "stale"))
    stall.decided(_decision(Outcome.REJECTED, "non_finite"))
    stall.decided(_decision(Outcome.APPLIED))
    assert stall.streak == 0
    assert not stall.reasons
    for _ in range(3):
        stall.decided(_decision(Outcome.REJECTED, "norm_bound"))
    stall.decided(_decision(Outcome.DROPPED, "stale"))
    assert stall.stalled
    assert stall.why() == (
        "3 updates refused and none applied since: 1 dropped stale, 3 rejected norm_bound "
        "(last: norm_bound)"
    )


def test_simulate_ends_a_stalled_run_with_one_line_per_algorithm_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "broken.toml"
    toml.write_text(
        '[task]\nname = "tests.sim.test_refusals:Broken"\n[fleet]\ndevices = 6\n'
        '[budget]\nmax_seconds = 21600\n[[algorithms]]\nkind = "fedasync"\n'
        '[[algorithms]]\nkind = "fedavg"\nclients_per_round = 3\n'
    )
    argv = ["simulate", "--config", str(toml), "--out", str(tmp_path / "o"), "--no-plots"]
    assert run_cli(argv) == 1
    err = capsys.readouterr().err
    stalls = [line for line in err.splitlines() if "none applied since" in line]
    assert [line.split(" stopped at ")[0] for line in stalls] == [
        "fedasync: fedasync",
        "fedasync: fedavg",
    ]
    assert all("rejected shape_mismatch" in line for line in stalls)
    assert "Traceback" not in err
    summary = (tmp_path / "o" / "summary.json").read_text()
    assert summary.count('"ended_by": "stalled"') == 2
