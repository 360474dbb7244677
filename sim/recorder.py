"""What a run keeps: scalars per decision and per evaluation, never a copy of the model.

The write-up's lesson (section 4.3): storing the model per update exhausts memory; τ, α, the
step norm, the outcome and who sent it are what tuning needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedasync.learning.evaluation import Evaluation
from fedasync.shared.decision import Decision


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    time_s: float
    device: int
    outcome: str
    reason: str | None
    tau: int | None
    alpha: float | None
    step_norm: float | None

    def scalars(self) -> tuple[int | None, float | None, float | None]:
        return self.tau, self.alpha, self.step_norm


@dataclass(frozen=True, slots=True)
class EvalPoint:
    time_s: float
    #: updates applied so far (device results folded into the model)
    updates: int
    #: model versions: server steps (each applied update in FedAsync, each K-update step in
    #: FedBuff), rounds for FedAvg
    version: int
    loss: float
    score: float
    per_class: dict[int, float]


@dataclass(frozen=True, slots=True)
class RoundRecord:
    start_s: float
    end_s: float
    selected: tuple[int, ...]
    kept: tuple[int, ...]


@dataclass(slots=True)
class Recorder:
    num_devices: int
    decisions: list[DecisionRecord] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    #: per device: results that reached the server, results used, runs lost mid-training,
    #: results finished but not waited for (synchronous over-selection or deadline)
    submitted: list[int] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    updates_applied: int = 0

    def __post_init__(self) -> None:
        for counts in (self.submitted, self.applied, self.lost, self.discarded):
            counts.extend([0] * self.num_devices)

    def decision(self, time_s: float, device: int, decision: Decision) -> None:
        self.submitted[device] += 1
        if decision.applied:
            self.applied[device] += 1
            self.updates_applied += 1
        self.decisions.append(
            DecisionRecord(
                time_s,
                device,
                decision.outcome.value,
                decision.reason,
                decision.tau,
                decision.alpha,
                decision.step_norm,
            )
        )

    def evaluation(self, time_s: float, version: int, result: Evaluation) -> None:
        point = EvalPoint(
            time_s, self.updates_applied, version, result.loss, result.score, result.per_class
        )
        if self.evals and (self.evals[-1].time_s, self.evals[-1].updates) == (
            time_s,
            self.updates_applied,
        ):
            self.evals[-1] = point
        else:
            self.evals.append(point)
