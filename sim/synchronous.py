"""Synchronous FedAvg on the same fleet: select, wait for the round, average by sample count.

A round lasts until the last kept device reports: every selected device when there is neither
over-selection nor a deadline, else the first m to finish, or what arrived by the deadline.
A device that drops out is noticed when it drops (optimistic for FedAvg: a real server would
often notice only at its timeout). The average is `shared/fedavg.py`, the core's only one.
Each result is first checked as the core checks an update (`shared/validation.py`: shape,
dtype, finiteness, ...); a refused one is recorded as a rejected decision, as the asynchronous
algorithms record the core's, and left out of the average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedasync.learning.dpsgd import FleetAccountants
from fedasync.shared.decision import Decision, Outcome
from fedasync.shared.device_privacy import reported
from fedasync.shared.fedavg import dp_fedavg, fedavg
from fedasync.shared.privacy.noise import gaussian
from fedasync.shared.privacy.spent import PrivacySpent
from fedasync.shared.seeds import Stream, simulated_dp_secret, stream
from fedasync.shared.update import Update
from fedasync.shared.validation import finite_problem, update_problem
from fedasync.sim.asynchronous import make_devices, privacy_summary
from fedasync.sim.clock import EventQueue
from fedasync.sim.config import FedAvgConfig, label
from fedasync.sim.device import RunPlan
from fedasync.sim.recorder import Recorder, RoundRecord
from fedasync.sim.result import EndedBy, Progress, RunResult
from fedasync.sim.stall import Stall
from fedasync.sim.world import World


@dataclass(frozen=True, slots=True)
class StartRound:
    pass


@dataclass(frozen=True, slots=True)
class EndRound:
    plans: dict[int, RunPlan]
    kept: tuple[int, ...]
    start: float


@dataclass(frozen=True, slots=True)
class Evaluate:
    pass


Event = StartRound | EndRound | Evaluate


class SyncRun:
    def __init__(self, spec: FedAvgConfig, world: World, progress: Progress | None = None) -> None:
        self.spec = spec
        self.world = world
        self.progress = progress
        self.devices = make_devices(world)
        self.recorder = Recorder(world.num_devices)
        self.accountants = None if world.dpsgd is None else FleetAccountants(world.dpsgd)
        #: refusals since the last applied result: too many end the run (sim/stall.py)
        self.stall = Stall()
        self.queue: EventQueue[Event] = EventQueue()
        self.rng = stream(world.seed, Stream.SERVER)
        self.weights = _read_only(world.init_weights.copy())
        self.rounds = 0
        #: local trainings run: only the results a round keeps are computed
        self.trainings = 0
        #: a StartRound or EndRound is scheduled; without one, only evaluations are left
        self.round_pending = True
        #: DP-FedAvg: the policy its rounds are accounted under, what they spent, the secret
        self.dp_policy = None if spec.dp_clip is None else spec.dp_policy(world.num_devices)
        self.privacy = PrivacySpent()
        self.dp_secret = simulated_dp_secret(world.seed)
        #: the privacy budget ended the run (before a round that would have passed it)
        self.closed = False

    def run(self) -> RunResult:
        budget = self.world.config.budget
        self.queue.push(0.0, Evaluate())
        self.queue.push(0.0, StartRound())
        ended_by: EndedBy = "no_more_events"
        end = 0.0
        while True:
            if not self.round_pending:  # no device will ever be online again
                end = self.queue.now
                break
            if self.queue.peek_time() > budget.max_seconds:
                ended_by, end = "max_seconds", budget.max_seconds
                break
            time, event = self.queue.pop()
            if isinstance(event, StartRound):
                self._start(time)
            elif isinstance(event, EndRound):
                self._end(time, event)
                if self.recorder.updates_applied >= budget.max_updates:
                    ended_by, end = "max_updates", time
                    break
                if self.stall.stalled:
                    ended_by, end = "stalled", time
                    break
                if self.closed:
                    ended_by, end = "privacy_budget", time
                    break
                self.queue.push(time, StartRound())
            else:
                result = self.world.task.evaluate(self.weights, self.world.test)
                self.recorder.evaluation(time, self.rounds, result)
                self.queue.push(time + self.world.config.eval.interval_s, Evaluate())
        self.recorder.evaluation(
            end, self.rounds, self.world.task.evaluate(self.weights, self.world.test)
        )
        return RunResult(
            name=label(self.spec),
            kind="fedavg",
            settings=self.spec.model_dump(mode="json", exclude={"kind", "name"}),
            recorder=self.recorder,
            ended_by=ended_by,
            end_s=end,
            version=self.rounds,
            weights=self.weights,
            counters={"rounds": self.rounds, "applied": self.recorder.updates_applied},
            trainings=self.trainings,
            stalled=self.stall.why() if ended_by == "stalled" else None,
            privacy=None
            if self.dp_policy is None
            else privacy_summary(self.privacy, self.dp_policy),
            attack_success=self.world.attack_success(self.weights),
        )

    def _start(self, now: float) -> None:
        online = [d.index for d in self.devices if d.availability.online_at(now)]
        if len(online) < self.spec.min_clients:
            backs = [
                t
                for d in self.devices
                if d.index not in online and (t := d.availability.next_online(now)) is not None
            ]
            later = [t for t in backs if t > now]
            if later:
                self.queue.push(min(later), StartRound())
            else:
                self.round_pending = False
            return
        m = self.spec.clients_per_round
        count = min(len(online), math.ceil(m * (1.0 + self.spec.over_selection) - 1e-9))
        chosen = self.rng.choice(np.asarray(online), size=count, replace=False)
        selected = sorted(int(d) for d in chosen)
        plans = {
            d: self.devices[d].plan_run(
                now, self.world.config.fleet.dropout, self.world.config.fleet.latency_factor(now)
            )
            for d in selected
        }
        deadline = now + self.spec.deadline_s if self.spec.deadline_s is not None else math.inf
        finishing = sorted(
            (p.end, d) for d, p in plans.items() if p.lost_at is None and p.end <= deadline
        )
        kept = tuple(sorted(d for _, d in finishing[:m]))
        if len(kept) == m:
            end = finishing[m - 1][0]
        else:  # wait for every selected device to report or drop, or for the deadline
            end = min(max(p.over_at for p in plans.values()), deadline)
        self.queue.push(end, EndRound(plans, kept, now))

    def _end(self, now: float, event: EndRound) -> None:
        if self._over_budget(event):
            self.closed = True
            return
        models, counts, clients = [], [], []
        for index, plan in event.plans.items():
            self.recorder.submitted[index] += plan.lost_at is None
            if plan.lost_at is not None:
                self.recorder.lost[index] += 1
            elif index not in event.kept:
                self.recorder.discarded[index] += 1
        for index in event.kept:
            device = self.devices[index]
            run = event.plans[index].run
            weights, metrics = self.world.local_training(
                index,
                device.data,
                self.weights,
                device.train_rng(run),
                run,
                None if self.accountants is None else self.accountants.of(index),
            )
            if self.accountants is not None:
                self.recorder.device_privacy.add(device.client_id, reported(metrics))
            self.trainings += 1
            update = Update(
                update_id=f"{device.client_id}-r{run}",
                client_id=device.client_id,
                base_version=self.rounds,
                num_samples=len(device.data),
                weights=weights,
                created_at=now,
            )
            refused = self._refusal(update)
            if refused is not None:
                self.recorder.refused(now, index, refused)
                self.stall.decided(refused)
                continue
            self.stall.applied()
            models.append(weights)
            counts.append(len(device.data))
            clients.append(device.client_id)
            self.recorder.applied[index] += 1
        if models:
            self._account(clients)
            self.weights = _read_only(self.aggregate(models, counts, clients))
            self.rounds += 1
            self.recorder.updates_applied += len(models)
        self.recorder.rounds.append(
            RoundRecord(event.start, now, tuple(sorted(event.plans)), event.kept)
        )
        if self.progress is not None:
            self.progress(now, self.recorder.updates_applied)

    def _over_budget(self, event: EndRound) -> bool:
        """DP-FedAvg with a privacy budget: the round would take ε past it (the core's own
        check, `PrivacySpent.prospective`, for the device that gains the most)."""
        policy = self.dp_policy
        if policy is None or policy.privacy_budget is None or not event.kept:
            return False
        spent = max(
            self.privacy.prospective(policy, self.devices[d].client_id, True) for d in event.kept
        )
        return spent > policy.privacy_budget

    def _account(self, clients: list[str]) -> None:
        """DP-FedAvg: the round's contributions and its noised step, in the accountant. Kept
        apart from `aggregate`, so that another framework's server handed the same round (the
        bench's seam) is accounted exactly as ours."""
        policy = self.dp_policy
        if policy is None:
            return
        assert policy.dp_clip is not None
        for client in clients:
            self.privacy.contribute(client, policy.dp_clip, True)
        self.privacy.stepped(policy, None)
        self.recorder.epsilon_now = self.privacy.epsilon(policy)

    def aggregate(
        self, models: list[np.ndarray], counts: list[int], clients: list[str]
    ) -> np.ndarray:
        """FedAvg's mean, or DP-FedAvg's noised clipped mean (shared/fedavg.py).

        A method of its own so that a bench can hand the same results to another framework's
        server instead (bench/flower_side.py) and change nothing else.
        """
        policy = self.dp_policy
        if policy is None:
            return fedavg(models, counts)
        assert policy.dp_clip is not None
        clip = policy.dp_clip
        noise = gaussian(self.dp_secret, self.rounds + 1, self.weights.size, policy.dp_noise * clip)
        return dp_fedavg(self.weights, models, self.spec.clients_per_round, clip, noise)

    def _refusal(self, update: Update) -> Decision | None:
        """The core's refusal of a round's result, or None when it may be averaged."""
        problem = update_problem(update, self.rounds, self.world.task.layout.size)
        if problem is None:
            problem = finite_problem(update.weights)
        if problem is None:
            return None
        reason, detail = problem
        return Decision(
            outcome=Outcome.REJECTED,
            update_id=update.update_id,
            client_id=update.client_id,
            base_version=update.base_version,
            version=self.rounds,
            policy_version=0,
            reason=str(reason),
            detail=detail,
        )


def _read_only(weights: np.ndarray) -> np.ndarray:
    """The global model is shared by the round's devices only for reading; writing would raise."""
    weights.flags.writeable = False
    return weights


def run_sync(world: World, algorithm_index: int, progress: Progress | None = None) -> RunResult:
    spec = world.config.algorithms[algorithm_index]
    if not isinstance(spec, FedAvgConfig):
        raise TypeError(f"algorithm {algorithm_index} is not fedavg")
    return SyncRun(spec, world, progress).run()
