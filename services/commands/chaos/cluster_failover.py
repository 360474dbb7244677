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
not touch. After the faults, every run is drained and checked (chaos/cluster_harness.py) as the
other profiles check their one (chaos/harness.py): the exactly-once verdict over its workers'
journals, `ledger verify`, the model served equal to the one committed, the lag at rest, the
waits; chaos/cluster_report.py builds the per-kill, per-run table from them.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from fedasync.services.commands.chaos.audit import Audit
from fedasync.services.commands.chaos.cluster_system import ClusterRun, ClusterSystem
from fedasync.services.commands.chaos.faults import (
    PROMOTED_WITHIN_S,
    RECOVERY_POLL_S,
    SETTLED_WITHIN_S,
    SNAPSHOT_WATCH_S,
    Event,
    Failover,
    due_restarts,
)
from fedasync.services.commands.chaos.probe import (
    Backlog,
    LagAtRest,
    Served,
    metric_samples,
)
from fedasync.services.commands.chaos.schedule import Fault
from fedasync.services.commands.chaos.system import SNAPSHOT
from fedasync.services.commands.chaos.waits import Interruption, Waits
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.entry import EXIT_REFUSED
from fedasync.services.stores.exactly_once import Verdict
from fedasync.services.worker.journal import JournalContents

#: how often the fault loop looks for exited children, seconds
TICK_S = 0.1
#: the snapshot service's gauge of a run frozen on its version going back (snapshot/metrics.py)
REGRESSED_METRIC = "fedasync_snapshot_version_regressed"


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
    #: snapshot service restarts because it froze on a run's version going back
    unfrozen: int = 0
    #: what the nodes' ACL LOGs hold (`read_acl_log`): commands refused, logins refused, and
    #: the reads that failed; each killed node's read just before its kill (its log dies with it)
    acl_refused: list[str] = field(default_factory=list)
    failed_logins: list[str] = field(default_factory=list)
    acl_log_unread: list[str] = field(default_factory=list)
    _exited_at: dict[str, float] = field(default_factory=dict)
    _snapshot_checked: float = 0.0
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
        self.watch_snapshot()

    def watch_snapshot(self) -> None:
        """A snapshot service that froze on a run's version going back (a failover that lost
        commits, durable mode off) is restarted, as docs/operations.md tells an operator to,
        at most once a second: as chaos/faults.py's `watch_snapshot`, the run found by the
        service's per-run gauge (its /readyz speaks for the default run only)."""
        if self.now() - self._snapshot_checked < SNAPSHOT_WATCH_S:
            return
        self._snapshot_checked = self.now()
        child = self.system.supervisor.children.get(SNAPSHOT)
        if child is None or not child.running():
            return
        samples = metric_samples(self.system.snapshot_url + "/metrics", REGRESSED_METRIC) or []
        frozen = sorted(labels.get("run", "?") for labels, value in samples if value)
        if not frozen:
            return
        if self.system.supervisor.kill(SNAPSHOT, signal.SIGTERM) is None:
            self.events.append(Event(self.now(), "hung_on_stop", SNAPSHOT))
            self.system.supervisor.kill(SNAPSHOT)
        self.system.supervisor.start(self.system.spec(SNAPSHOT))
        self.unfrozen += 1
        self.events.append(
            Event(self.now(), "restarted", f"{SNAPSHOT}: it froze on {', '.join(frozen)}")
        )

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds`, supervising meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.supervise()
            time.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))

    def read_acl_log(self, nodes: list[RedisServer] | None = None) -> None:
        """Add what the ACL LOG of `nodes` (by default every running node) holds."""
        cluster = self.system.cluster
        try:
            self.acl_refused += cluster.acl_refusals(nodes)
            self.failed_logins += cluster.failed_logins(nodes)
        except (redis.RedisError, OSError) as exc:
            self.acl_log_unread.append(str(exc))
            self.events.append(Event(self.now(), "acl_log_unread", str(exc)))

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
        node = cluster.node_on(old)
        if self.system.acl:
            self.read_acl_log([node])
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
