"""The cluster failover audit: kill -9 the primaries of a Redis Cluster under load, per run.

`fedasync chaos --profile cluster-failover` starts a cluster holding several runs, each on a
primary of its own (chaos/cluster_system.py), and kills -9 a primary at each fault of the
seeded schedule, round-robin over the runs: the first kill takes the first run's primary, the
next the second's, and so on. A kill waits for the cluster to be settled (every node up, one
slot map, each replica in sync) and for every run to have committed since the last kill, so
each kill's figures are its own. Its replica is promoted by the cluster itself (no Sentinels);
the killed node starts again on its port and directory `outage_s` after the promotion, and
rejoins as the new primary's replica (redis_launch/cluster.py).

Each kill is read once per run, as the Sentinel audit reads its one run (chaos/faults.py,
`Failover`): the version the run's primary announced just before, the version and commit
sequence on its primary just after the promotion. The run whose slot was on the killed primary
is the kill's victim; the others are bystanders, read on their own primaries, which the kill did
not touch. After the faults, every run is drained and checked as the other profiles check their
one (chaos/harness.py): the exactly-once verdict over its workers' journals, `ledger verify`,
the model served equal to the one committed, the lag at rest, the waits; chaos/cluster_report.py
builds the per-kill, per-run table from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from fedasync.services.commands.chaos.audit import Audit, audit
from fedasync.services.commands.chaos.cluster_system import ClusterRun, ClusterSystem
from fedasync.services.commands.chaos.faults import (
    PROMOTED_WITHIN_S,
    RECOVERY_POLL_S,
    SETTLED_WITHIN_S,
    Event,
    Failover,
    due_restarts,
    wait_until,
)
from fedasync.services.commands.chaos.probe import (
    Backlog,
    LagAtRest,
    Served,
    wait_drained,
    wait_lag_at_rest,
    wait_served,
)
from fedasync.services.commands.chaos.schedule import Fault, FaultKind, Profile, build_schedule
from fedasync.services.commands.chaos.system import AGGREGATOR_SETTINGS, SNAPSHOT
from fedasync.services.commands.chaos.waits import Interruption, Waits, measure
from fedasync.services.runtime.entry import EXIT_REFUSED
from fedasync.services.stores.exactly_once import Decided, Verdict, check
from fedasync.services.worker.journal import JournalContents, read_journals
from fedasync.shared.snapshot_protocol import latest_path

#: as chaos/harness.py waits for its one run, for each run
DRAIN_TIMEOUT_S = 120.0
SERVED_TIMEOUT_S = 30.0
LAG_TIMEOUT_S = 30.0
#: how often the fault loop looks for exited children, seconds
TICK_S = 0.1
#: how long the workers have to finish a publish in flight when told to stop, seconds
WORKER_STOP_S = 15.0


@dataclass(slots=True)
class Kill:
    """One kill -9 of a primary: which node, how it died, who took over, when it came back."""

    at: float
    wall: float
    old_port: int
    #: the runs whose slot was on it
    victims: list[str]
    #: the killed process's exit status: -9 (SIGKILL) proves the kill happened
    exit_code: int | None = None
    new_port: int | None = None
    promoted_s: float | None = None
    #: seconds from the kill until the node answered again, as a replica of `new_port`
    restarted_s: float | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "wall": self.wall,
            "old_port": self.old_port,
            "victims": self.victims,
            "exit_code": self.exit_code,
            "new_port": self.new_port,
            "promoted_s": None if self.promoted_s is None else round(self.promoted_s, 3),
            "restarted_s": None if self.restarted_s is None else round(self.restarted_s, 3),
            "problems": self.problems,
        }


@dataclass(frozen=True, slots=True)
class AtRest:
    """A run once its workers stopped: its stream drained, its model served, its lag."""

    drained: bool
    backlog: Backlog
    served: Served
    lag: LagAtRest


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run's checks read after the faults."""

    run: ClusterRun
    at_rest: AtRest
    audit: Audit
    journals: JournalContents
    verdict: Verdict
    waits: Waits


@dataclass(slots=True)
class ClusterInjector:
    """Kills primaries, restarts them, and restarts what exits unasked, as a supervisor would."""

    system: ClusterSystem
    kills: list[Kill] = field(default_factory=list)
    #: one per kill and run, in kill order
    failovers: list[Failover] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    events: list[Event] = field(default_factory=list)
    #: by run: the kills that may delay its decisions (its own primary's only)
    interruptions: dict[str, list[Interruption]] = field(default_factory=dict)
    _exited_at: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.started

    def supervise(self) -> None:
        """Start again, after the back-off, each child that exited when nobody asked it to; an
        aggregator's refusal (exit 4, after a failover that lost commits) is counted apart."""
        now = self.now()
        supervisor = self.system.supervisor
        for name in due_restarts(supervisor, self.system.children, self._exited_at, now):
            code = supervisor.children[name].process.returncode
            run = self.system.run_of(name)
            if code == EXIT_REFUSED and run is not None and name == run.aggregator:
                self.refusals[name] += 1
                self.events.append(Event(now, "refused", f"{name} exited with 4; restarted"))
            else:
                self.crashes[name] += 1
                self.events.append(Event(now, "crashed", f"{name} exited with {code}; restarted"))
            supervisor.start(self.system.spec(name))

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds`, supervising meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.supervise()
            time.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))

    def _primary(self, run: ClusterRun) -> int:
        return self.system.cluster.primary_of(run.tag)

    def _read(self, run: ClusterRun, port: int, key: str) -> int:
        return int(self.system.cluster.read(port, key) or 0)

    def wait_recovered(self) -> None:
        """Until every run has committed on its primary since the last kill (a victim on the
        promoted replica): each kill's figures are then its own, and the run shows every run
        carrying on. TimeoutError after SETTLED_WITHIN_S."""
        if not self.kills:
            return
        last = {f.run: f.seq_after for f in self.failovers[-len(self.system.runs) :]}
        deadline = time.monotonic() + SETTLED_WITHIN_S
        waiting = list(self.system.runs)
        while time.monotonic() < deadline:
            self.supervise()
            for run in list(waiting):
                with contextlib.suppress(redis.RedisError, OSError, RuntimeError):
                    seq = self._read(run, self._primary(run), run.keys.commit_seq)
                    if seq > (last.get(run.id) or 0):
                        waiting.remove(run)
            if not waiting:
                return
            time.sleep(RECOVERY_POLL_S)
        names = ", ".join(r.id for r in waiting)
        raise TimeoutError(f"no commit of {names} since the last kill in {SETTLED_WITHIN_S} s")

    def kill(self, fault: Fault, index: int) -> None:
        """Kill -9 the primary of run `index` (round-robin), once the cluster is settled and
        every run recovered from the last kill; wait for the promotion; restart the node after
        its outage, as the new primary's replica."""
        cluster = self.system.cluster
        runs = self.system.runs
        target = runs[index % len(runs)]
        try:
            cluster.wait_settled(SETTLED_WITHIN_S)
            self.wait_recovered()
            old = self._primary(target)
            primaries = {run.id: self._primary(run) for run in runs}
        except (TimeoutError, redis.RedisError, OSError, RuntimeError) as exc:
            self.skipped[fault.kind.value] += 1
            self.events.append(Event(self.now(), f"skipped {fault.kind.value}", str(exc)))
            return
        now = self.now()
        victims = [run for run in runs if primaries[run.id] == old]
        records = {
            run.id: Failover(
                now,
                primaries[run.id],
                run=run.id,
                role="victim" if run in victims else "bystander",
            )
            for run in runs
        }
        for run in runs:
            record = records[run.id]
            try:
                record.version_before = self._read(
                    run, record.old_port, run.keys.announced
                ) or self._read(run, record.old_port, run.keys.version)
            except (redis.RedisError, OSError) as exc:
                record.problems.append(f"no reading before the kill: {exc}")
        node = cluster.node_on(old)
        process = node.process
        cluster.kill(node)
        wall = time.time()
        kill = Kill(now, wall, old, [run.id for run in victims])
        kill.exit_code = None if process is None else process.returncode
        self.kills.append(kill)
        self.injected[fault.kind.value] += 1
        self.events.append(
            Event(now, "kill_primary", f"127.0.0.1:{old}, primary of {', '.join(kill.victims)}")
        )
        try:
            kill.new_port, kill.promoted_s = cluster.wait_promoted(
                old, target.tag, PROMOTED_WITHIN_S
            )
        except TimeoutError as exc:
            kill.problems.append(str(exc))
        for run in runs:
            record = records[run.id]
            record.wall = wall
            record.promoted_s = kill.promoted_s
            if run in victims:
                promoted = kill.promoted_s if kill.promoted_s is not None else PROMOTED_WITHIN_S
                self.interruptions.setdefault(run.id, []).append(
                    Interruption.failover(wall, promoted)
                )
            try:
                record.new_port = self._primary(run)
                record.version_after = self._read(run, record.new_port, run.keys.version)
                record.seq_after = self._read(run, record.new_port, run.keys.commit_seq)
            except (redis.RedisError, OSError, RuntimeError) as exc:
                record.problems.append(f"no reading after the promotion: {exc}")
            if run in victims and kill.new_port is None:
                record.problems.append("no promotion seen")
            self.failovers.append(record)
        self.events.append(
            Event(
                self.now(),
                "promoted",
                f"127.0.0.1:{kill.new_port} after "
                + ("?" if kill.promoted_s is None else f"{kill.promoted_s:.2f} s")
                + "; "
                + ", ".join(
                    f"{r.run} ({r.role}) v{r.version_before}→v{r.version_after}"
                    for r in records.values()
                ),
            )
        )
        self._wait(fault.outage_s)  # down a while longer, then back, as its replica
        try:
            cluster.restart(node)
            kill.restarted_s = time.time() - wall
            self.events.append(Event(self.now(), "restarted", f"127.0.0.1:{old}"))
        except (RuntimeError, OSError) as exc:
            kill.problems.append(f"not restarted: {exc}")


def run_cluster_failover(
    profile: Profile,
    seed: int,
    out: Path,
    say: Callable[[str], None] = print,
    variants: Sequence[int | None] | None = None,
    policy: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The profile once per durable mode of `variants` (default: the profile's own), each in a
    folder of its own; their summaries (chaos/cluster_report.py)."""
    summaries = []
    for replicas in variants if variants is not None else (profile.durable_replicas,):
        variant = dataclasses.replace(profile, durable_replicas=replicas)
        name = "durable-off" if replicas == 0 else "durable-on"
        say(f"chaos: profile {variant.label}")
        summaries.append(run_once(variant, seed, out / name, say, policy))
    return summaries


def run_once(
    profile: Profile,
    seed: int,
    out: Path,
    say: Callable[[str], None] = print,
    policy: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Start the cluster and the runs, kill the scheduled primaries, drain and check each run;
    the summary, also in `out`/summary.json."""
    from fedasync.services.commands.chaos.cluster_report import build_summary
    from fedasync.services.commands.chaos.report import write_summary

    out.mkdir(parents=True, exist_ok=True)
    schedule = [f for f in build_schedule(profile, seed) if f.kind is FaultKind.FAILOVER]
    started = time.monotonic()
    with ClusterSystem(out, profile, policy) as system:
        say(f"chaos: starting a Redis Cluster and {profile.cluster_runs} runs (logs in {out})")
        system.start()
        placed = ", ".join(
            f"{r.id} on 127.0.0.1:{system.cluster.primary_of(r.tag)}" for r in system.runs
        )
        say(f"chaos: runs {placed}; {len(schedule)} kills of a primary")
        injector = ClusterInjector(system)
        for index, fault in enumerate(schedule):
            while injector.now() < fault.at:
                injector.supervise()
                wait_until(injector.started + min(fault.at, injector.now() + TICK_S))
            injector.kill(fault, index)
            for event in injector.events[-3:]:
                say(f"chaos: t={event.at:6.2f} s {event.what}: {event.detail}")
        try:
            system.cluster.wait_settled(SETTLED_WITHIN_S)
            injector.wait_recovered()
        except TimeoutError as exc:
            say(f"chaos: {exc}")  # the report shows no commit after that kill
        say("chaos: kills over; stopping the workers and draining each run")
        for name in system.workers:
            if system.supervisor.kill(name, signal.SIGTERM, wait=WORKER_STOP_S) is None:
                system.supervisor.kill(name)
        rested = [_drain(system, injector, run) for run in system.runs]
        system.supervisor.stop_all(groups=[[SNAPSHOT], [run.aggregator for run in system.runs]])
        say("chaos: services stopped; auditing each run's ledger")
        results = [
            _judge(run, at_rest, injector) for run, at_rest in zip(system.runs, rested, strict=True)
        ]
    summary = build_summary(
        profile=profile,
        seed=seed,
        out=out,
        duration_s=time.monotonic() - started,
        injector=injector,
        results=results,
    )
    write_summary(out, summary)
    return summary


def _drain(system: ClusterSystem, injector: ClusterInjector, run: ClusterRun) -> AtRest:
    """Wait until the run's stream is drained, its model served and its lag at rest 0, reading
    its primary (no kill is due any more: the run's slot stays there)."""
    client = redis.Redis(port=system.cluster.primary_of(run.tag), socket_timeout=10.0)
    tick = injector.supervise
    try:
        drained, backlog = wait_drained(client, run.keys, DRAIN_TIMEOUT_S, tick)
        path = latest_path(None if run.default else run.id)
        served = wait_served(client, run.keys, system.snapshot_url, SERVED_TIMEOUT_S, tick, path)
        logs = sorted(system.supervisor.log_dir.glob(f"{run.aggregator}*.log"))
        lag = wait_lag_at_rest(client, run.keys, run.metrics_url, logs, LAG_TIMEOUT_S, tick)
    finally:
        client.close()
    return AtRest(drained, backlog, served, lag)


def _judge(run: ClusterRun, at_rest: AtRest, injector: ClusterInjector) -> RunResult:
    """The run's ledger read and replayed (`ledger verify`), its exactly-once verdict over its
    workers' journals, and its waits."""
    system = injector.system
    audited = asyncio.run(audit(system.cluster.url, run.keys, system.cluster.addresses))
    journals = read_journals(run.journals())
    verdict = check(
        set(journals.acknowledged),
        journals.attempted,
        [Decided.from_record(record) for record in audited.records],
        audited.entry_ids,
        audited.dead_lettered,
    )
    waits = measure(
        audited.records,
        AGGREGATOR_SETTINGS.decision_bound_s,
        injector.interruptions.get(run.id, []),
    )
    return RunResult(run, at_rest, audited, journals, verdict, waits)
