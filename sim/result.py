"""What one algorithm's run returns to the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedasync.shared.decision import Decision
from fedasync.shared.update import Update
from fedasync.sim.recorder import Recorder

#: "stalled": STALL_REFUSALS updates refused, none applied since (sim/stall.py);
#: "privacy_budget": the core closed training at the policy's privacy budget
EndedBy = Literal["max_updates", "max_seconds", "no_more_events", "stalled", "privacy_budget"]

#: called with (simulated seconds, updates applied) as the run advances
Progress = Callable[[float, int], None]
#: called with every update the simulator submits and the core's decision about it
DecisionHook = Callable[[Update, Decision], None]


@dataclass(frozen=True, slots=True, eq=False)
class RunResult:
    name: str
    kind: str
    #: the settings that ran: the policy (FedAsync, FedBuff) or the round rules (FedAvg)
    settings: dict[str, Any]
    recorder: Recorder
    ended_by: EndedBy
    end_s: float
    version: int
    weights: np.ndarray
    #: the core's counters (applied, dropped, ...) or, for FedAvg, rounds and updates
    counters: dict[str, int]
    #: local trainings run: device results computed (an update the core drops without reading
    #: its weights is not trained, and neither is a FedAvg result that is not waited for)
    trainings: int = 0
    #: switches an automatic rule flipped during the run: time, switch, on, policy version
    policy_changes: tuple[dict[str, Any], ...] = ()
    #: alerts the automatic rules raised: time, rule, message, client (fairness)
    alerts: tuple[dict[str, Any], ...] = ()
    #: what the rules saw at each evaluation: (time s, decisions/s over the window, lag)
    rule_figures: tuple[tuple[float, float, float], ...] = ()
    #: why the run ended as "stalled" (`Stall.why`: the refusals and their counts), else None
    stalled: str | None = None
    #: DP runs: the privacy spent (`privacy_summary`), else None
    privacy: dict[str, Any] | None = None
    #: the backdoor's success on the final model (`[attack] kind = "backdoor"`), else None
    attack_success: float | None = None
