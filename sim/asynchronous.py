"""FedAsync and FedBuff on the simulated fleet: every update decided by the core.

A device snapshots the model (a copy) when it starts, trains for its latency in virtual time,
and submits an `Update`; `AggregationState.apply` with the algorithm's `Policy` decides it,
exactly as in the aggregator service. FedBuff is the same state machine in another mode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from shared.aggregation import AggregationState, ModelSnapshot
from shared.policy import Policy
from shared.rules import ActionKind, DecisionWindow, Hysteresis, SwitchRule
from shared.switches import switch_off, switch_on
from shared.update import Update
from sim.clock import EventQueue
from sim.config import FedAsyncConfig, RateRuleConfig, label
from sim.device import Device, RunPlan
from sim.recorder import Recorder
from sim.result import DecisionHook, EndedBy, Progress, RunResult
from sim.world import World


@dataclass(frozen=True, slots=True)
class Ready:
    """The device wants to start a run (if online and a slot is free)."""

    device: int


@dataclass(frozen=True, slots=True)
class Finish:
    device: int
    plan: RunPlan
    snapshot: ModelSnapshot


@dataclass(frozen=True, slots=True)
class Lost:
    device: int


@dataclass(frozen=True, slots=True)
class Evaluate:
    pass


Event = Ready | Finish | Lost | Evaluate


def make_devices(world: World) -> list[Device]:
    fleet = world.new_fleet()
    return [
        Device(i, world.client_ids[i], data, fleet.latencies[i], fleet.availability[i], world.seed)
        for i, data in enumerate(world.device_data)
    ]


class AsyncRun:
    """One FedAsync or FedBuff run: the event loop and the fleet's bookkeeping."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        world: World,
        progress: Progress | None = None,
        on_decision: DecisionHook | None = None,
        rate_rule: RateRuleConfig | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self.rule: SwitchRule | None = None
        self.window = DecisionWindow(rate_rule.window_s if rate_rule else 60.0, per_client=20)
        self.saved: dict[str, Any] = {}
        self.policy_changes: list[dict[str, Any]] = []
        if rate_rule is not None:
            gate = Hysteresis(
                rate_rule.rate_high, rate_rule.rate_low, rate_rule.hold_s, rate_rule.cooldown_s
            )
            self.rule = SwitchRule("update-rate", "update_rate", rate_rule.switch, gate)
        self.world = world
        self.progress = progress
        self.on_decision = on_decision
        self.state = AggregationState(world.init_weights.copy(), world.task.layout)
        self.devices = make_devices(world)
        self.recorder = Recorder(world.num_devices)
        self.queue: EventQueue[Event] = EventQueue()
        self.waiting: deque[int] = deque()
        self.training = 0
        fleet = world.config.fleet
        self.capacity = fleet.max_concurrency or world.num_devices
        self.dropout = fleet.dropout

    def run(self) -> RunResult:
        budget = self.world.config.budget
        for device in self.devices:
            self.queue.push(0.0, Ready(device.index))
        self.queue.push(0.0, Evaluate())
        ended_by: EndedBy = "no_more_events"
        end = 0.0
        while True:
            if not self.queue or self._only_evaluations_left():
                end = self.queue.now
                break
            if self.queue.peek_time() > budget.max_seconds:
                ended_by, end = "max_seconds", budget.max_seconds
                break
            time, event = self.queue.pop()
            if isinstance(event, Ready):
                self._ready(time, event.device)
            elif isinstance(event, Finish):
                self._finish(time, event)
                if self.recorder.updates_applied >= budget.max_updates:
                    ended_by, end = "max_updates", time
                    break
            elif isinstance(event, Lost):
                self.recorder.lost[event.device] += 1
                self.training -= 1
                self.queue.push(time, Ready(event.device))
                self._start_waiting(time)
            else:
                self._evaluate(time)
                self._run_rule(time)
                self.queue.push(time + self.world.config.eval.interval_s, Evaluate())
        self._evaluate(end)
        return RunResult(
            name=self.name,
            kind=self.policy.mode.value,
            settings=self.policy.to_dict(),
            recorder=self.recorder,
            ended_by=ended_by,
            end_s=end,
            version=self.state.version,
            weights=self.state.weights_view(),
            counters=dict(self.state.counters),
            policy_changes=tuple(self.policy_changes),
        )

    def _run_rule(self, now: float) -> None:
        """The control service's rule, on virtual time: flips switches through the same core."""
        if self.rule is None:
            return
        for action in self.rule.evaluate(self.window.figures(now)):
            assert action.switch is not None
            if action.kind is ActionKind.SWITCH_ON:
                self.policy, self.saved = switch_on(self.policy, action.switch)
            else:
                self.policy = switch_off(self.policy, self.saved)
            self.policy_changes.append(
                {
                    "at_s": now,
                    "switch": action.switch,
                    "on": action.kind is ActionKind.SWITCH_ON,
                    "policy_version": self.policy.version,
                    "why": action.message,
                }
            )

    def _only_evaluations_left(self) -> bool:
        return self.training == 0 and not self.waiting and len(self.queue) == 1

    def _ready(self, now: float, index: int) -> None:
        availability = self.devices[index].availability
        if availability.online_at(now):
            self.waiting.append(index)
            self._start_waiting(now)
            return
        back = availability.next_online(now)
        if back is not None:
            self.queue.push(back, Ready(index))

    def _start_waiting(self, now: float) -> None:
        while self.training < self.capacity and self.waiting:
            index = self.waiting.popleft()
            device = self.devices[index]
            if not device.availability.online_at(now):
                self._ready(now, index)
                continue
            plan = device.plan_run(now, self.dropout)
            self.training += 1
            if plan.lost_at is not None:
                self.queue.push(plan.lost_at, Lost(index))
            else:
                self.queue.push(plan.end, Finish(index, plan, self.state.snapshot()))

    def _finish(self, now: float, event: Finish) -> None:
        device = self.devices[event.device]
        params = self.world.training
        weights, metrics = self.world.task.train(
            event.snapshot.weights,
            device.data,
            device.train_rng(event.plan.run),
            epochs=params.epochs,
            lr=params.lr,
            batch_size=params.batch_size,
        )
        update = Update(
            update_id=f"{device.client_id}-r{event.plan.run}",
            client_id=device.client_id,
            base_version=event.snapshot.version,
            num_samples=len(device.data),
            weights=weights,
            created_at=now,
            metrics=metrics,
        )
        decision = self.state.apply(update, self.policy)
        self.recorder.decision(now, event.device, decision)
        self.window.add(
            now, decision.outcome.value, decision.client_id, decision.tau, decision.alpha
        )
        if self.on_decision is not None:
            self.on_decision(update, decision)
        self.training -= 1
        self.queue.push(now, Ready(event.device))
        self._start_waiting(now)
        if self.progress is not None:
            self.progress(now, self.recorder.updates_applied)

    def _evaluate(self, now: float) -> None:
        result = self.world.task.evaluate(self.state.weights_view(), self.world.test)
        self.recorder.evaluation(now, self.state.version, result)


def run_async(
    world: World,
    algorithm_index: int,
    policy: Policy,
    progress: Progress | None = None,
    on_decision: DecisionHook | None = None,
) -> RunResult:
    """Run the configured algorithm at `algorithm_index` with its resolved `policy`."""
    algorithm = world.config.algorithms[algorithm_index]
    rule = algorithm.rate_rule if isinstance(algorithm, FedAsyncConfig) else None
    return AsyncRun(label(algorithm), policy, world, progress, on_decision, rule).run()
