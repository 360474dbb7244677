"""What a run keeps: scalars per decision and per evaluation, never a copy of the model.

The write-up's lesson (section 4.3): storing the model per update exhausts memory; τ, α, the
step norm, the outcome and who sent it are what tuning needs.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from fedasync.learning.evaluation import Evaluation
from fedasync.shared.decision import Decision
from fedasync.shared.device_privacy import WorstDevice


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


class DecisionLog(Sequence[DecisionRecord]):
    """Every decision of a run, kept as columns of machine numbers (about 45 bytes each).

    A run of a million devices decides tens of millions of updates; as one object per
    decision they would not fit in memory. A record is rebuilt, value for value, when read.
    """

    _NONE = -(2**63)  # τ absent: no τ a run can reach

    def __init__(self) -> None:
        self._time = array("d")
        self._device = array("q")
        self._outcome = array("B")
        self._reason = array("B")
        self._tau = array("q")
        self._alpha = array("d")
        self._step_norm = array("d")
        #: bit 0: alpha present, bit 1: step norm present
        self._present = array("B")
        #: the outcome and reason strings met so far, in the order met; a code is an index
        self._words: list[str | None] = []
        self._codes: dict[str | None, int] = {}

    def _code(self, word: str | None) -> int:
        code = self._codes.get(word)
        if code is None:
            code = self._codes[word] = len(self._words)
            self._words.append(word)
        return code

    def append(self, record: DecisionRecord) -> None:
        self.add(record.time_s, record.device, record.outcome, record.reason, *record.scalars())

    def add(
        self,
        time_s: float,
        device: int,
        outcome: str,
        reason: str | None,
        tau: int | None,
        alpha: float | None,
        step_norm: float | None,
    ) -> None:
        """Append one decision's values (what `append` does, without a record to unpack)."""
        self._time.append(time_s)
        self._device.append(device)
        self._outcome.append(self._code(outcome))
        self._reason.append(self._code(reason))
        self._tau.append(self._NONE if tau is None else tau)
        self._alpha.append(0.0 if alpha is None else alpha)
        self._step_norm.append(0.0 if step_norm is None else step_norm)
        self._present.append((alpha is not None) | (step_norm is not None) << 1)

    def add_decision(self, time_s: float, device: int, decision: Decision) -> None:
        """`add` of a decision's values, written out: it runs once per decision, a million
        times in a run of 100,000 devices (issue 29), and the call it saves is a tenth of it."""
        tau, alpha, step_norm = decision.tau, decision.alpha, decision.step_norm
        self._time.append(time_s)
        self._device.append(device)
        self._outcome.append(self._code(decision.outcome.value))
        self._reason.append(self._code(decision.reason))
        self._tau.append(self._NONE if tau is None else tau)
        self._alpha.append(0.0 if alpha is None else alpha)
        self._step_norm.append(0.0 if step_norm is None else step_norm)
        self._present.append((alpha is not None) | (step_norm is not None) << 1)

    def __len__(self) -> int:
        return len(self._time)

    @overload
    def __getitem__(self, index: int) -> DecisionRecord: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[DecisionRecord]: ...
    def __getitem__(self, index: int | slice) -> DecisionRecord | Sequence[DecisionRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        present, tau = self._present[index], self._tau[index]
        return DecisionRecord(
            self._time[index],
            self._device[index],
            str(self._words[self._outcome[index]]),
            self._words[self._reason[index]],
            None if tau == self._NONE else tau,
            self._alpha[index] if present & 1 else None,
            self._step_norm[index] if present & 2 else None,
        )

    def __iter__(self) -> Iterator[DecisionRecord]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


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
    decisions: DecisionLog = field(default_factory=DecisionLog)
    evals: list[EvalPoint] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    #: per device: results that reached the server, results used, runs lost mid-training,
    #: results finished but not waited for (synchronous over-selection or deadline)
    submitted: list[int] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    updates_applied: int = 0
    #: DP runs: (time s, updates applied, sampled ε, conservative ε) at each evaluation
    epsilon: list[tuple[float, int, float | None, float | None]] = field(default_factory=list)
    #: DP runs: the ε of the latest decision (sampled, conservative), None before one
    epsilon_now: tuple[float | None, float | None] | None = None
    #: the worst ε a device reported (DP-SGD on the devices); empty without it
    device_privacy: WorstDevice = field(default_factory=WorstDevice)

    def __post_init__(self) -> None:
        for counts in (self.submitted, self.applied, self.lost, self.discarded):
            counts.extend([0] * self.num_devices)

    def decision(self, time_s: float, device: int, decision: Decision) -> None:
        self.submitted[device] += 1
        if decision.applied:
            self.applied[device] += 1
            self.updates_applied += 1
        self.decisions.add_decision(time_s, device, decision)
        if decision.epsilon_conservative is not None:
            self.epsilon_now = (decision.epsilon_sampled, decision.epsilon_conservative)

    def refused(self, time_s: float, device: int, decision: Decision) -> None:
        """A FedAvg round's result that the core's checks refused: logged as the asynchronous
        algorithms' decisions are, and not counted as submitted again (the round counted it)."""
        self.decisions.add(
            time_s, device, decision.outcome.value, decision.reason, None, None, None
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
        if self.epsilon_now is not None:
            sampled, conservative = self.epsilon_now
            spent = (time_s, self.updates_applied, sampled, conservative)
            if self.epsilon and self.epsilon[-1][:2] == spent[:2]:
                self.epsilon[-1] = spent
            else:
                self.epsilon.append(spent)
