"""FedAsync and FedBuff on the simulated fleet: every update decided by the core.

A device snapshots the model (a copy) when it starts, trains for its latency in virtual time,
and submits an `Update`; `AggregationState.apply` with the algorithm's `Policy` decides it,
exactly as in the aggregator service. FedBuff is the same state machine in another mode.

With `decide_s` the aggregator is a single server taking that long per decision: updates that
arrive while it is busy wait in arrival order (the stream), and their number is the lag the
control service's lag rule watches. With `rules`, the control service's rules run every
`interval_s` of virtual time, built by the same `build_rules`, fed by the same `DecisionWindow`,
and their switches change the policy through the same `switch_on`/`switch_off`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedasync.learning.dpsgd import FleetAccountants
from fedasync.shared.aggregation import PRIVACY_BUDGET, AggregationState
from fedasync.shared.device_privacy import reported
from fedasync.shared.policy import Policy
from fedasync.shared.privacy.spent import PrivacySpent
from fedasync.shared.rules import ActionKind, DecisionWindow, Rule, build_rules
from fedasync.shared.seeds import simulated_dp_secret
from fedasync.shared.switches import switch_off, switch_on
from fedasync.shared.tree import LocalTree, TreeShape
from fedasync.shared.update import Update
from fedasync.sim.clock import EventQueue
from fedasync.sim.config import FedAvgConfig, FedBuffConfig, RulesConfig, label
from fedasync.sim.device import Device, Devices, ParkedStream, RunPlan
from fedasync.sim.recorder import Recorder
from fedasync.sim.result import DecisionHook, EndedBy, Progress, RunResult
from fedasync.sim.stall import Stall
from fedasync.sim.world import World


@dataclass(frozen=True, slots=True)
class Ready:
    """The device wants to start a run (if online and a slot is free)."""

    device: int


@dataclass(frozen=True, slots=True)
class Finish:
    """The device's run ends and its update arrives; `base_weights` is the model it trained
    from, the core's own (read-only) array of `base_version`, shared by every run that started
    from that version instead of a copy per run."""

    device: int
    plan: RunPlan
    base_version: int
    base_weights: np.ndarray


@dataclass(slots=True)
class Arrival:
    """An update that arrived and is not decided yet. Unless the run trains eagerly, it holds
    no weights: they are computed at its decision, and only if the core will read them."""

    device: int
    run: int
    base_version: int
    base_weights: np.ndarray
    at: float
    trained: tuple[np.ndarray, Mapping[str, float]] | None = None


@dataclass(frozen=True, slots=True)
class Lost:
    device: int


@dataclass(frozen=True, slots=True)
class Evaluate:
    pass


@dataclass(frozen=True, slots=True)
class Decide:
    """The aggregator finishes deciding the oldest waiting update."""


@dataclass(frozen=True, slots=True)
class RuleTick:
    pass


Event = Ready | Finish | Lost | Evaluate | Decide | RuleTick

#: thresholds for a rule the config leaves off (it is disabled; these are never compared)
_NEVER = float("inf")


def make_devices(world: World) -> Devices:
    """This algorithm's fleet: fresh latency and availability state, devices made on first use."""
    fleet = world.new_fleet()
    parked = ParkedStream(world.num_devices)
    data = world.device_data

    def make(i: int) -> Device:
        return Device(
            i,
            world.client_ids[i],
            lambda: data[i],
            fleet.latencies[i],
            fleet.availability[i],
            world.seed,
            parked,
        )

    return Devices(fleet.availability, make)


class AsyncRun:
    """One FedAsync or FedBuff run: the event loop and the fleet's bookkeeping."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        world: World,
        progress: Progress | None = None,
        on_decision: DecisionHook | None = None,
        rules: RulesConfig | None = None,
        decide_s: float = 0.0,
        *,
        eager: bool = False,
        tree: TreeShape | None = None,
    ) -> None:
        self.name = name
        #: train every update when it arrives, as before issue 16; off, an update the core
        #: drops without reading (stale, beyond the dedup horizon) is never trained. Both give
        #: the same decisions and curves (tests/sim/test_lazy_training.py)
        #: with DP-SGD every run is trained, as a device trains it whatever the server does
        #: with its update, so each device's ε counts every run, as on a real device
        self.eager = eager or world.dpsgd is not None
        self.accountants = None if world.dpsgd is None else FleetAccountants(world.dpsgd)
        #: local trainings run (device results computed)
        self.trainings = 0
        self.policy = policy
        self.rules_config = rules
        self.rules: list[Rule] = [] if rules is None else make_rules(rules)
        self.window = DecisionWindow(
            rules.window_s if rules else 60.0, rules.fairness_decisions if rules else 20
        )
        #: per switch that is on: the values it replaced
        self.saved: dict[str, dict[str, Any]] = {}
        self.policy_changes: list[dict[str, Any]] = []
        self.alerts: list[dict[str, Any]] = []
        self.rule_figures: list[tuple[float, float, float]] = []
        self.decide_s = decide_s
        #: updates that arrived and are not yet decided, oldest first
        self.inbox: deque[Arrival] = deque()
        self.world = world
        self.progress = progress
        self.on_decision = on_decision
        #: hierarchical FedBuff: the leaves decide, the root (`state`) steps (shared/tree.py)
        self.tree = (
            None if tree is None else LocalTree(world.init_weights.copy(), world.task.layout, tree)
        )
        self.state = (
            AggregationState(
                world.init_weights.copy(),
                world.task.layout,
                dp_secret=simulated_dp_secret(world.seed) if policy.private else None,
            )
            if self.tree is None
            else self.tree.root.state
        )
        self.devices = make_devices(world)
        self.recorder = Recorder(world.num_devices)
        #: refusals since the last applied update: too many end the run (sim/stall.py)
        self.stall = Stall()
        self.queue: EventQueue[Event] = EventQueue()
        self.waiting: deque[int] = deque()
        self.training = 0
        fleet = self.fleet = world.config.fleet
        self.capacity = fleet.max_concurrency or world.num_devices
        self.dropout = fleet.dropout
        #: events that reschedule themselves for ever (evaluations, rule ticks)
        self.periodic = 1 + (rules is not None)

    def run(self) -> RunResult:
        budget = self.world.config.budget
        self.queue.push(0.0, Evaluate())
        if self.rules_config is not None:
            self.queue.push(0.0, RuleTick())
        # every device is ready at 0, before the evaluation and the rule tick at 0: handled here
        # in device order rather than as a million events, with the same effects in that order
        for index in range(len(self.devices)):
            self._ready(0.0, index)
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
            elif isinstance(event, (Finish, Decide)):
                ready_now = None
                if isinstance(event, Finish):
                    ready_now = self._finish(time, event)
                else:
                    self._decide_next(time)
                if self.recorder.updates_applied >= budget.max_updates:
                    ended_by, end = "max_updates", time
                    break
                if self.stall.stalled:
                    ended_by, end = "stalled", time
                    break
                if self.state.closed == PRIVACY_BUDGET:
                    ended_by, end = "privacy_budget", time
                    break
                if ready_now is not None:
                    self._ready(time, ready_now)
            elif isinstance(event, Lost):
                self.recorder.lost[event.device] += 1
                self.training -= 1
                self.queue.push(time, Ready(event.device))
                self._start_waiting(time)
            elif isinstance(event, RuleTick):
                self._run_rules(time)
                assert self.rules_config is not None
                self.queue.push(time + self.rules_config.interval_s, RuleTick())
            else:
                self._evaluate(time)
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
            counters=dict(self.state.counters) if self.tree is None else self.tree.counters(),
            trainings=self.trainings,
            policy_changes=tuple(self.policy_changes),
            alerts=tuple(self.alerts),
            rule_figures=tuple(self.rule_figures),
            stalled=self.stall.why() if ended_by == "stalled" else None,
            privacy=privacy_summary(self.state.privacy, self.policy)
            if self.policy.private
            else None,
            attack_success=self.world.attack_success(self.state.weights_view()),
        )

    def _run_rules(self, now: float) -> None:
        """The control service's rules on virtual time: flip switches through the same core,
        and keep alerts where the service would append them to its alerts stream."""
        lag = float(len(self.inbox))
        figures = self.window.figures(now, lag)
        self.rule_figures.append((now, figures.update_rate, lag))
        for action in [a for rule in self.rules for a in rule.evaluate(figures)]:
            if action.kind is ActionKind.ALERT:
                self.alerts.append(
                    {"at_s": now, "rule": action.rule, "message": action.message}
                    | ({"client": action.client} if action.client else {})
                )
                continue
            assert action.switch is not None
            on = action.kind is ActionKind.SWITCH_ON
            if on == (action.switch in self.saved):
                continue  # already in that state: the service answers AlreadyInState
            if on:
                self.policy, self.saved[action.switch] = switch_on(self.policy, action.switch)
            else:
                self.policy = switch_off(self.policy, self.saved.pop(action.switch))
            self.policy_changes.append(
                {
                    "at_s": now,
                    "rule": action.rule,
                    "switch": action.switch,
                    "on": on,
                    "policy_version": self.policy.version,
                    "why": action.message,
                }
            )

    def _only_evaluations_left(self) -> bool:
        idle = self.training == 0 and not self.waiting and not self.inbox
        return idle and len(self.queue) == self.periodic

    def _ready(self, now: float, index: int) -> None:
        availability = self.devices.availability[index]
        if availability.online_at(now):
            if not self.waiting and self.training < self.capacity:
                self._start(now, index)  # what queueing it and starting the queue would do
                return
            self.waiting.append(index)
            self._start_waiting(now)
            return
        back = availability.next_online(now)
        if back is not None:
            self.queue.push(back, Ready(index))

    def _start_waiting(self, now: float) -> None:
        while self.training < self.capacity and self.waiting:
            index = self.waiting.popleft()
            if not self.devices.availability[index].online_at(now):
                self._ready(now, index)
                continue
            self._start(now, index)

    def _start(self, now: float, index: int) -> None:
        """Device `index`, online at `now` and given a free slot, starts a run."""
        device = self.devices[index]
        factor = self.fleet.latency_factor(now) if self.fleet.phases else 1.0
        plan = device.plan_run(now, self.dropout, factor)
        self.training += 1
        if plan.lost_at is not None:
            self.queue.push(plan.lost_at, Lost(index))
        else:
            version, weights = self.state.version, self.state.weights_view()
            self.queue.push(plan.end, Finish(index, plan, version, weights))

    def _finish(self, now: float, event: Finish) -> int | None:
        """The update arrives and the device is ready again at once; returns the device if
        the caller is to handle its readiness right away.

        As an event, Ready(now) would be the very next one popped unless another is already
        due at `now` (ties keep scheduling order): only then is it scheduled. Otherwise the
        caller handles it after the budget check, as the popped event would have been, saving
        a push and a pop per update with the same order of effects.
        """
        arrival = Arrival(event.device, event.plan.run, event.base_version, event.base_weights, now)
        if self.eager:
            arrival.trained = self._train(arrival)
        self.training -= 1
        if self.decide_s > 0:
            self.inbox.append(arrival)
            if len(self.inbox) == 1:  # the aggregator was idle: it starts on this one
                self.queue.push(now + self.decide_s, Decide())
        else:
            self._decide(now, arrival)
        ready_now: int | None = event.device
        if self.queue and self.queue.peek_time() <= now:
            self.queue.push(now, Ready(event.device))
            ready_now = None
        self._start_waiting(now)
        return ready_now

    def _train(self, arrival: Arrival) -> tuple[np.ndarray, Mapping[str, float]]:
        """The device's local training: a pure function of the base model, the device's data
        and its run's own stream, so it gives the same weights whenever it is computed."""
        device = self.devices[arrival.device]
        self.trainings += 1
        return self.world.local_training(
            arrival.device,
            device.data,
            arrival.base_weights,
            device.train_rng(arrival.run),
            arrival.run,
            None if self.accountants is None else self.accountants.of(arrival.device),
        )

    def _decide_next(self, now: float) -> None:
        """The oldest waiting update is decided now, under the policy in force now."""
        self._decide(now, self.inbox.popleft())
        if self.inbox:
            self.queue.push(now + self.decide_s, Decide())

    def _decide(self, now: float, arrival: Arrival) -> None:
        """Decide an arrived update; train it first only if the core will read its weights.

        An update the core drops without reading (`drops_unread`) is decided by the core from
        its ids and base version alone (`decide_unread`), neither trained nor built as an
        `Update`: at 100,000 devices almost every arrival is one (issue 29). Should the core
        leave it to `apply` (a duplicate, training closed), it is submitted with the model it
        started from in place of its weights (float32 of the model's size, as training
        returns): the core checks only their dtype and shape before dropping it. The hook
        `on_decision` gets such an `Update` too.
        """
        device = self.devices[arrival.device]
        update_id = f"{device.client_id}-r{arrival.run}"
        num_samples = self.world.device_data.size(arrival.device)
        weights: np.ndarray
        metrics: Mapping[str, float]
        unread = False
        if arrival.trained is not None:
            weights, metrics = arrival.trained
        elif self._decider(arrival.device).drops_unread(arrival.base_version, self.policy):
            # a tree's leaf decides it through the tree (its partial's bookkeeping), untrained
            weights, metrics, unread = arrival.base_weights, {}, self.tree is None
        else:
            weights, metrics = self._train(arrival)
        self.state.zeno_prepare(self.policy, self.world.validation_gradient)  # Zeno++'s v
        decision = None
        if unread:
            decision = self.state.decide_unread(
                update_id, device.client_id, arrival.base_version, num_samples, self.policy
            )
        update = None
        if decision is None or self.on_decision is not None:
            update = Update(
                update_id=update_id,
                client_id=device.client_id,
                base_version=arrival.base_version,
                num_samples=num_samples,
                weights=weights,
                created_at=arrival.at,
                metrics=metrics,
            )
        if decision is None:
            assert update is not None
            if self.tree is None:
                decision = self.state.apply(update, self.policy)
            else:
                decision = self.tree.apply(update, self.policy)
        self.recorder.decision(now, arrival.device, decision)
        if self.accountants is not None:
            self.recorder.device_privacy.add(device.client_id, reported(metrics))
        self.stall.decided(decision)
        if self.rules:  # only the rules read the window; without them it would only grow
            self.window.add(
                now, decision.outcome.value, decision.client_id, decision.tau, decision.alpha
            )
        if self.on_decision is not None:
            assert update is not None
            self.on_decision(update, decision)
        if self.progress is not None:
            self.progress(now, self.recorder.updates_applied)

    def _decider(self, device: int) -> AggregationState:
        """The state that decides the device's updates: the one aggregator, or its leaf."""
        if self.tree is None:
            return self.state
        return self.tree.leaf_of(self.world.client_ids[device]).state

    def _evaluate(self, now: float) -> None:
        result = self.world.task.evaluate(self.state.weights_view(), self.world.test)
        self.recorder.evaluation(now, self.state.version, result)


def run_async(
    world: World,
    algorithm_index: int,
    policy: Policy,
    progress: Progress | None = None,
    on_decision: DecisionHook | None = None,
    *,
    eager: bool = False,
) -> RunResult:
    """Run the configured algorithm at `algorithm_index` with its resolved `policy`."""
    algorithm = world.config.algorithms[algorithm_index]
    assert not isinstance(algorithm, FedAvgConfig)
    tree = algorithm.tree if isinstance(algorithm, FedBuffConfig) else None
    return AsyncRun(
        label(algorithm),
        policy,
        world,
        progress,
        on_decision,
        algorithm.rules,
        algorithm.decide_s,
        eager=eager,
        tree=None if tree is None else tree.shape(),
    ).run()


def privacy_summary(privacy: PrivacySpent, policy: Policy) -> dict[str, Any]:
    """What a DP run spent, as the summary reports it (`PrivacySpent.summary`)."""
    return privacy.summary(policy)


def make_rules(config: RulesConfig) -> list[Rule]:
    """The control service's rules (`build_rules`) with the thresholds of a simulation config."""
    return build_rules(
        rate_high=_NEVER if config.rate_high is None else config.rate_high,
        rate_low=_NEVER if config.rate_low is None else config.rate_low,
        lag_high=_NEVER if config.lag_high is None else config.lag_high,
        lag_low=_NEVER if config.lag_low is None else config.lag_low,
        hold_s=config.hold_s,
        cooldown_s=config.cooldown_s,
        max_consecutive_drops=config.max_consecutive_drops or 2**62,
        max_drop_share=1.0 if config.max_drop_share is None else config.max_drop_share,
        fairness_min_rate=config.fairness_min_rate or 0.0,
        fairness_decisions=config.fairness_decisions,
        disabled=config.disabled(),
        rate_switch=config.rate_switch,
    )
