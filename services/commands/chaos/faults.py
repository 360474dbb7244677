"""Injecting faults into the running system, and recovering from them as a supervisor would.

A kill is a SIGKILL (no cleanup runs), followed after a short outage by a start with the same
settings; Redis comes back from its append-only file on the same port and directory. A pause is
`CLIENT PAUSE <ms> ALL`: Redis holds every client's commands while their sockets time out. A
stall holds one of the aggregator's commands at its Redis proxy (chaos/proxy.py). A second
aggregator is started while the first runs; the first is stopped (SIGSTOP) meanwhile and later
continued, and must then stop by itself, fenced off (exit code 3).
Children that exit when nobody asked them to (e.g. an aggregator that found Redis gone while
starting) are restarted too, after a short back-off, and counted: the run reports them.

Each Redis kill is checked (chaos/restarts.py): what Redis held just before the kill, with
writes paused, must be there just after the restart.

A failover (replicated profiles) kills the primary of the moment with SIGKILL, without pausing
anything first: what it had not yet sent to a replica is what a lost host takes with it. A
pause of the primary (`pause_primary`) freezes it with SIGSTOP instead, past the Sentinels'
down-after, until they have promoted a replica and a moment longer, then lets it go on with
SIGCONT, as a VM paused, a long stall or a partition that heals would: the services' open
connections to it are still there, and it is still a primary in its own eyes until the
Sentinels demote it; the injector reads what it announces meanwhile. The
injector reads the version announced on the old primary (what devices may have been offered) just
before, and the version committed on the new one just after the Sentinels promote it
(`Failover`): the shortfall is how many versions moved back. (In durable mode a commit still
waiting for its replica is committed but not announced; losing it moves nothing devices saw.)
The killed server starts again after its outage, as a replica of the new primary. What follows
a failover that lost commits is handled as a supervisor and an operator would: an aggregator
that refuses (exit 4) is started again and counted as a refusal, not a crash, and a snapshot
service that froze on the version going back is restarted (docs/operations.md, "Redis moved
back in time").
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import redis

from fedasync.services.commands.chaos.proxy import Stall, StallMode
from fedasync.services.commands.chaos.restarts import RestartCheck, compare, read_marks
from fedasync.services.commands.chaos.schedule import REPLICATED_ONLY, Fault, FaultKind
from fedasync.services.commands.chaos.slow_clients import SlowClients
from fedasync.services.commands.chaos.system import (
    AGGREGATOR,
    KEEP_VERSIONS,
    SNAPSHOT,
    System,
    worker_name,
)
from fedasync.services.commands.chaos.waits import Interruption
from fedasync.services.commands.redis_launch.server import free_port
from fedasync.services.runtime.entry import EXIT_REFUSED
from fedasync.services.runtime.supervisor import Supervisor

#: least time between a child's unexpected exit and its restart, seconds (a supervisor's back-off)
RESTART_BACKOFF_S = 0.5
REDIS = "redis"
PROXY = "redis-proxy"
#: how an aggregator fenced off by a newer one exits (services/runtime/entry.py)
FENCED_EXIT = 3
#: how long a continued superseded aggregator may take to find itself fenced off and stop (it
#: does at its next claim, within a second or two; generous for a loaded machine)
FENCED_WITHIN_S = 30.0
#: how long the Sentinels may take to promote a replica (they need about 2 s), and the group to
#: settle again (the killed server back and in sync) before the next failover, seconds
PROMOTED_WITHIN_S = 60.0
SETTLED_WITHIN_S = 60.0
#: how long a slow-clients burst waits for the snapshot service to listen (just restarted)
LISTENING_WITHIN_S = 15.0
#: how often the snapshot service's /readyz is asked whether it froze, seconds
SNAPSHOT_WATCH_S = 1.0
#: how often the injector looks for the first commit after a failover, seconds
RECOVERY_POLL_S = 0.1
#: how often a resumed primary's announced version is read until its demotion, seconds
RESUMED_POLL_S = 0.05
#: the /readyz status of a snapshot service that froze on Redis going back (snapshot/app.py)
REGRESSED_STATUS = "version regressed"
#: the pending-restart name of a killed server of a replicated Redis: this prefix and its port
SERVER = "redis:"


@dataclass(slots=True)
class Failover:
    """One loss of the primary (a kill -9, or a pause and a resume): who was lost, who took
    over, and what moved back."""

    at: float
    old_port: int
    #: "kill" (SIGKILL) or "pause" (SIGSTOP past the Sentinels' down-after, then SIGCONT)
    how: str = "kill"
    #: wall clock of the kill, to find the first commit after it in the ledger
    wall: float = 0.0
    new_port: int | None = None
    #: from the kill until the Sentinels name the new primary and it says it is one, seconds
    promoted_s: float | None = None
    #: the version announced on the old primary just before the kill (committed, if none is),
    #: and the version committed on the new one just after its promotion
    version_before: int | None = None
    version_after: int | None = None
    #: the commit sequence on the new primary just after its promotion
    seq_after: int | None = None
    #: a pause: how long the primary stayed frozen, seconds (past down-after: the fault
    #: happened), and the highest version it announced from its resume until it was demoted
    #: (a primary that goes on as one after its resume serves versions the new one lacks)
    frozen_s: float | None = None
    version_resumed: int | None = None
    problems: list[str] = field(default_factory=list)
    #: a cluster's failover, read per run (chaos/cluster_failover.py): the run, and "victim"
    #: if the primary lost held its slot, else "bystander" (its primary was not touched; the
    #: ports and versions are then its own primary's); None: the one run of a Sentinel group
    run: str | None = None
    role: str | None = None

    @property
    def moved_back(self) -> int:
        """Versions the old primary had announced (before the fault or, paused, after its
        resume) that the new one does not hold."""
        if self.version_before is None or self.version_after is None:
            return 0
        announced = max(self.version_before, self.version_resumed or 0)
        return max(0, announced - self.version_after)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "wall": self.wall,
            "how": self.how,
            "frozen_s": None if self.frozen_s is None else round(self.frozen_s, 3),
            "version_resumed": self.version_resumed,
            "old_port": self.old_port,
            "new_port": self.new_port,
            "promoted_s": None if self.promoted_s is None else round(self.promoted_s, 3),
            "version_before": self.version_before,
            "version_after": self.version_after,
            "moved_back": self.moved_back,
            "problems": self.problems,
        } | ({} if self.run is None else {"run": self.run, "role": self.role})


@dataclass(slots=True)
class Event:
    """Something the injector did, for the run's summary."""

    at: float
    what: str
    detail: str = ""
    #: wall-clock time, to line the event up with the children's log files
    wall: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        millis = int(self.wall * 1000) % 1000
        stamp = time.strftime("%H:%M:%S", time.localtime(self.wall)) + f".{millis:03d}"
        return {"at": round(self.at, 3), "wall": stamp, "what": self.what, "detail": self.detail}


@dataclass(slots=True)
class Injector:
    system: System
    injected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    #: unexpected exits by service name (restarted)
    crashes: Counter[str] = field(default_factory=Counter)
    events: list[Event] = field(default_factory=list)
    #: one per Redis kill: what it held before, what it had after the restart
    restarts: list[RestartCheck] = field(default_factory=list)
    #: (due time, target) of each restart not yet made
    pending: list[tuple[float, str]] = field(default_factory=list)
    _exited_at: dict[str, float] = field(default_factory=dict)
    #: how each injected fault may delay decisions (chaos/waits.py)
    interruptions: list[Interruption] = field(default_factory=list)
    #: first aggregators a second one superseded, and (due time, name) of those still stopped
    superseded: list[str] = field(default_factory=list)
    stopped: list[tuple[float, str]] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    bursts: list[SlowClients] = field(default_factory=list)
    #: slow clients a burst opens (the profile's)
    slow_clients: int = 100
    #: replicated profiles: each kill of the primary, and what followed
    failovers: list[Failover] = field(default_factory=list)
    #: aggregators that refused to decide (exit 4) and were started again, by name
    refusals: Counter[str] = field(default_factory=Counter)
    #: snapshot services restarted because they froze on the version going back
    unfrozen: int = 0
    _snapshot_checked: float = 0.0
    #: the injector's clock starts with the fault phase: a fault's `at` counts from here
    started: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.started

    # ------------------------------------------------------------------------------- faults
    def inject(self, fault: Fault) -> None:
        now = self.now()
        target = self._target(fault)
        if any(name == target for _, name in self.pending):
            self._skip(fault, now, f"{target} is still down from an earlier fault")
            return
        if fault.kind is FaultKind.PAUSE_REDIS:
            self._pause(fault, now)
            return
        if fault.kind is FaultKind.STALL_REDIS:
            if self.system.proxy is None:
                self._skip(fault, now, "the aggregator talks to Redis without a proxy")
                return
            self.stalls.append(
                self.system.proxy.stall(fault.command, fault.outage_s, StallMode(fault.mode))
            )
            self._injected(fault, now)
            return
        if fault.kind is FaultKind.SECOND_AGGREGATOR:
            self._second_aggregator(fault, now)
            return
        if fault.kind in REPLICATED_ONLY:
            self._failover(fault, now)
            return
        if fault.kind is FaultKind.SLOW_CLIENTS:
            port = self.system.snapshot_port
            # restarted a moment ago, it may not listen yet: a burst met by refusals tests nothing
            if not _listening("127.0.0.1", port, LISTENING_WITHIN_S):
                self._skip(fault, now, f"{SNAPSHOT} not listening after {LISTENING_WITHIN_S} s")
                return
            burst = SlowClients("127.0.0.1", port, self.slow_clients, fault.outage_s)
            self.bursts.append(burst.start())
            self._injected(fault, now)
            return
        if target == REDIS:
            self._kill_redis(now)
        else:
            child = self.system.supervisor.children[target]
            if not child.running():
                self._skip(fault, now, f"{target} was not running")
                return
            sig = signal.SIGTERM if fault.kind is FaultKind.RESTART_SNAPSHOT else signal.SIGKILL
            code = self.system.supervisor.kill(target, sig)
            if code is None:  # a graceful stop that hangs is itself a finding: force it
                self.events.append(Event(now, "hung_on_stop", target))
                self.system.supervisor.kill(target)
        self.pending.append((now + fault.outage_s, target))
        self._injected(fault, now)

    def _injected(self, fault: Fault, now: float) -> None:
        self.injected[fault.kind.value] += 1
        self.events.append(Event(now, fault.kind.value, fault.describe()))
        interruption = Interruption.of(fault.kind.value, time.time(), fault.outage_s)
        if interruption is not None:
            self.interruptions.append(interruption)

    def _second_aggregator(self, fault: Fault, now: float) -> None:
        """Start a second aggregator while the first runs. The first is stopped first, so that
        a read it has blocked in Redis takes entries after the second one's takeover at start;
        the running one must take them over (docs/architecture.md, the decision bound)."""
        supervisor = self.system.supervisor
        first = supervisor.children.get(AGGREGATOR)
        if first is None or not first.running():
            self._skip(fault, now, f"{AGGREGATOR} was not running")
            return
        name = f"{AGGREGATOR}-superseded-{len(self.superseded) + 1}"
        supervisor.rename(AGGREGATOR, name)
        first.process.send_signal(signal.SIGSTOP)
        self.system.aggregator_port = free_port()  # the first still holds its metrics port
        supervisor.start(self.system.aggregator_spec())
        self.superseded.append(name)
        self.stopped.append((now + fault.outage_s, name))
        self._injected(fault, now)

    def settle(self) -> None:
        """After the run: a superseded aggregator must have stopped by itself, fenced off; a
        stall that never happened is counted as skipped, not injected."""
        now = self.now()
        for name in self.superseded:
            child = self.system.supervisor.children[name]
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=FENCED_WITHIN_S)
            if child.running():
                self.system.supervisor.kill(name)
                self.crashes[name] += 1
                self.events.append(Event(now, "not fenced", f"{name} was still running"))
            elif child.process.returncode != FENCED_EXIT:
                self.crashes[name] += 1
                code = child.process.returncode
                self.events.append(Event(now, "crashed", f"{name} exited with {code}, not 3"))
        for burst in self.bursts:
            burst.join(timeout=60)
            self.events.append(
                Event(
                    now,
                    "slow_clients",
                    f"{burst.opened} opened, {burst.closed_by_server} closed by the server "
                    f"within the burst's {burst.seconds:.1f} s",
                )
            )
        for stall in self.stalls:
            if not stall.hits:
                self.injected[FaultKind.STALL_REDIS.value] -= 1
                self.skipped[FaultKind.STALL_REDIS.value] += 1
                self.events.append(Event(now, "skipped stall_redis", "never happened"))

    def _failover(self, fault: Fault, now: float) -> None:
        """Kill -9 (or pause) the primary once the group is whole and in sync; wait for the
        promotion. A paused primary is resumed `fault.outage_s` after it, and watched until
        the Sentinels demote it (`_resume`)."""
        group = self.system.group
        if group is None:
            self._skip(fault, now, "Redis is not replicated")
            return
        if any(name.startswith(SERVER) for _, name in self.pending):
            self._skip(fault, now, "a server killed earlier is still down")
            return
        try:
            group.wait_settled(SETTLED_WITHIN_S)
            self.wait_recovered()
        except TimeoutError as exc:
            self._skip(fault, now, str(exc))
            return
        now = self.now()
        old = group.primary_port()
        pause = fault.kind is FaultKind.PAUSE_PRIMARY
        record = Failover(now, old, how="pause" if pause else "kill")
        keys = self.system.keys
        try:
            record.version_before = self._announced(old)
        except (redis.RedisError, OSError) as exc:
            record.problems.append(f"no reading before the kill: {exc}")
        server = group.server_on(old)
        frozen_at = time.monotonic()
        if pause:
            group.pause(server)
        else:
            group.kill(server)
        record.wall = time.time()
        self.failovers.append(record)
        self._injected(fault, now)
        try:
            record.new_port, record.promoted_s = group.wait_promoted(old, PROMOTED_WITHIN_S)
            record.version_after = int(group.read(record.new_port, keys.version) or 0)
            record.seq_after = int(group.read(record.new_port, keys.commit_seq) or 0)
        except (TimeoutError, redis.RedisError, OSError) as exc:
            record.problems.append(f"no promotion seen: {exc}")
        finally:
            promoted = record.promoted_s if record.promoted_s is not None else PROMOTED_WITHIN_S
            if pause:
                time.sleep(fault.outage_s)  # frozen a while longer, then back as it was
                group.resume(server)
                record.frozen_s = time.monotonic() - frozen_at
                promoted = record.frozen_s
            self.interruptions.append(Interruption.failover(record.wall, promoted))
            if not pause:
                # the killed server stays down its outage after the promotion (or the wait)
                self.pending.append((self.now() + fault.outage_s, f"{SERVER}{old}"))
        if pause:
            self._watch_resumed(record)
        if record.new_port is None:
            return
        resumed = (
            f", resumed after {record.frozen_s:.2f} s frozen, announcing up to version "
            f"{record.version_resumed} until demoted"
            if pause and record.frozen_s is not None
            else ""
        )
        self.events.append(
            Event(
                self.now(),
                "promoted",
                f"127.0.0.1:{record.new_port} after {record.promoted_s:.2f} s; version "
                f"{record.version_before} announced before the {record.how}, "
                f"{record.version_after} committed on the new primary{resumed}",
            )
        )

    def _announced(self, port: int) -> int:
        """The version a server announces (its committed one, if it announces none)."""
        keys = self.system.keys
        group = self.system.group
        assert group is not None
        return int(group.read(port, keys.announced) or group.read(port, keys.version) or 0)

    def _watch_resumed(self, record: Failover) -> None:
        """After a resume: read the old primary's announced version until the Sentinels have
        made it a replica again, keeping the highest (what devices could be offered there)."""
        group = self.system.group
        assert group is not None
        deadline = time.monotonic() + SETTLED_WITHIN_S
        while time.monotonic() < deadline:
            try:
                role = group.replication(record.old_port).get("role")
                announced = self._announced(record.old_port)
            except (redis.RedisError, OSError) as exc:
                record.problems.append(f"no reading after the resume: {exc}")
                return
            record.version_resumed = max(record.version_resumed or 0, announced)
            if role != "master":
                return
            time.sleep(RESUMED_POLL_S)
        record.problems.append(f"not demoted within {SETTLED_WITHIN_S} s of its resume")

    def wait_recovered(self) -> None:
        """Until the aggregator has committed on the primary promoted by the last failover, so
        each failover's figures are its own (a kill during the recovery from the previous one
        would add to them), and so the run shows the services carrying on against it before its
        workers are stopped. Restarts what exits meanwhile; TimeoutError after SETTLED_WITHIN_S.
        """
        group = self.system.group
        if group is None or not self.failovers or self.failovers[-1].seq_after is None:
            return
        last = self.failovers[-1]
        deadline = time.monotonic() + SETTLED_WITHIN_S
        while time.monotonic() < deadline:
            self.restart_exited([AGGREGATOR, SNAPSHOT, *self.system.workers])
            self.watch_snapshot()
            with contextlib.suppress(redis.RedisError, OSError, RuntimeError):
                seq = group.read(group.primary_port(), self.system.keys.commit_seq)
                if int(seq or 0) > (last.seq_after or 0):
                    return
            time.sleep(RECOVERY_POLL_S)
        raise TimeoutError(f"no commit since the last failover in {SETTLED_WITHIN_S} s")

    def watch_snapshot(self) -> None:
        """Replicated profiles: a snapshot service that froze on the version going back is
        restarted, as docs/operations.md tells an operator to (at most once a second)."""
        if self.system.group is None or self.now() - self._snapshot_checked < SNAPSHOT_WATCH_S:
            return
        self._snapshot_checked = self.now()
        child = self.system.supervisor.children.get(SNAPSHOT)
        if (
            child is None
            or not child.running()
            or _ready_status(self.system.snapshot_url) != (REGRESSED_STATUS)
        ):
            return
        if self.system.supervisor.kill(SNAPSHOT, signal.SIGTERM) is None:
            self.events.append(Event(self.now(), "hung_on_stop", SNAPSHOT))
            self.system.supervisor.kill(SNAPSHOT)
        self.system.supervisor.start(self.system.spec(SNAPSHOT))
        self.unfrozen += 1
        self.events.append(
            Event(self.now(), "restarted", f"{SNAPSHOT}: it froze, {REGRESSED_STATUS}")
        )

    def _kill_redis(self, now: float) -> None:
        """Read what Redis holds (writes stay paused), then SIGKILL it."""
        check = RestartCheck(now)
        try:
            check.before = read_marks(self.system.observer_url, self.system.keys, unpause=False)
        except (redis.RedisError, OSError) as exc:
            check.problems.append(f"no reading before the kill: {exc}")
        self.restarts.append(check)
        self.system.server.kill()

    def _check_restart(self) -> None:
        """Read Redis again after a restart and compare with the reading before the kill."""
        check = self.restarts[-1] if self.restarts else None
        if check is None or check.before is None or check.after is not None:
            return
        try:
            check.after = read_marks(self.system.observer_url, self.system.keys, check.before)
        except (redis.RedisError, OSError) as exc:
            check.problems.append(f"no reading after the restart: {exc}")
            return
        check.problems += compare(check.before, check.after, KEEP_VERSIONS)
        if check.problems:
            self.events.append(
                Event(self.now(), "redis_restart_damaged", "; ".join(check.problems))
            )
        self._rewrite_aof()

    def _rewrite_aof(self) -> None:
        """Rewrite the AOF of the Redis just restarted, as Redis's own automatic rewrite would
        in a longer run: a later kill then restarts Redis from a rewritten base plus the reads
        logged after it, the path on which Redis 7.0's `entries-read`, and so its lag, can drift
        (its AOF logs a read as XCLAIM … LASTID, which leaves the counter where the rewrite put
        it; tests/integration/test_lag_at_rest.py makes it drift on purpose). The run's lag at
        rest must be 0 either way (probe.wait_lag_at_rest)."""
        client = self.system.observer(socket_timeout=5.0)
        try:
            client.bgrewriteaof()
        except redis.RedisError as exc:
            self.events.append(Event(self.now(), "aof_rewrite_failed", str(exc)))
        else:
            self.events.append(Event(self.now(), "aof_rewrite", "after the restart"))
        finally:
            client.close()

    def _pause(self, fault: Fault, now: float) -> None:
        client = self.system.observer(socket_timeout=5.0)
        try:
            client.client_pause(int(fault.outage_s * 1000), all=True)
        except redis.RedisError as exc:
            self._skip(fault, now, f"CLIENT PAUSE failed: {exc}")
            return
        finally:
            client.close()
        self._injected(fault, now)

    def _skip(self, fault: Fault, now: float, why: str) -> None:
        self.skipped[fault.kind.value] += 1
        self.events.append(Event(now, f"skipped {fault.kind.value}", why))

    @staticmethod
    def _target(fault: Fault) -> str:
        return {
            FaultKind.KILL_WORKER: worker_name(fault.target),
            FaultKind.KILL_AGGREGATOR: AGGREGATOR,
            FaultKind.KILL_REDIS: REDIS,
            FaultKind.PAUSE_REDIS: REDIS,
            FaultKind.RESTART_SNAPSHOT: SNAPSHOT,
            FaultKind.SECOND_AGGREGATOR: AGGREGATOR,
            FaultKind.STALL_REDIS: PROXY,
            FaultKind.SLOW_CLIENTS: SNAPSHOT,
            FaultKind.FAILOVER: SERVER + "primary",
            FaultKind.PAUSE_PRIMARY: SERVER + "primary",
        }[fault.kind]

    # ----------------------------------------------------------------------------- recovery
    def recover(self, everything: bool = False) -> None:
        """Restart what is due (or, with `everything`, all that is down on purpose)."""
        now = self.now()
        due = [(at, name) for at, name in self.pending if everything or at <= now]
        for entry in due:
            self.pending.remove(entry)
            self._start(entry[1])
            self.events.append(Event(now, "restarted", entry[1]))
        for entry in [(at, name) for at, name in self.stopped if everything or at <= now]:
            self.stopped.remove(entry)
            with contextlib.suppress(ProcessLookupError):
                self.system.supervisor.children[entry[1]].process.send_signal(signal.SIGCONT)
            self.events.append(Event(now, "continued", f"{entry[1]} (to find itself fenced)"))

    def restart_exited(self, names: list[str]) -> None:
        """Children of `names` that exited unasked: count them and start them after a back-off."""
        now = self.now()
        down_on_purpose = {name for _, name in self.pending}
        for name in due_restarts(
            self.system.supervisor, names, self._exited_at, now, down_on_purpose
        ):
            code = self.system.supervisor.children[name].process.returncode
            if code == EXIT_REFUSED and name == AGGREGATOR and self.system.group is not None:
                # after a failover that lost commits: its refusal is the documented behaviour,
                # and a restart resumes from what the new primary holds
                self.refusals[name] += 1
                self.events.append(Event(now, "refused", f"{name} exited with 4; restarted"))
            else:
                self.crashes[name] += 1
                self.events.append(Event(now, "crashed", f"{name} exited with {code}; restarted"))
            self._start(name)

    def _start(self, name: str) -> None:
        if name == REDIS:
            self.system.server.start()  # replays the AOF; returns once it answers PING
            self._check_restart()
        elif name.startswith(SERVER) and self.system.group is not None:
            group = self.system.group
            group.restart(group.server_on(int(name.removeprefix(SERVER))))
        else:
            self.system.supervisor.start(self.system.spec(name))

    def next_due(self) -> float | None:
        return min((at for at, _ in [*self.pending, *self.stopped]), default=None)

    @property
    def recovering(self) -> bool:
        """Something is down or stopped on purpose, due to come back."""
        return bool(self.pending or self.stopped)


def due_restarts(
    supervisor: Supervisor,
    names: list[str],
    exited_at: dict[str, float],
    now: float,
    down: Collection[str] = (),
) -> list[str]:
    """Which of `names` exited unasked (not `down` on purpose) and have waited out the back-off
    (RESTART_BACKOFF_S since their exit was first seen, in `exited_at`, which this keeps): due
    to start again, as a supervisor would."""
    due = []
    for name in names:
        child = supervisor.children.get(name)
        if child is None or child.running() or child.expected_exit or name in down:
            continue
        first_seen = exited_at.setdefault(name, now)
        if now - first_seen < RESTART_BACKOFF_S:
            continue
        del exited_at[name]
        due.append(name)
    return due


def _listening(host: str, port: int, within_s: float) -> bool:
    """Whether (host, port) accepts a connection within `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(RECOVERY_POLL_S)


def _ready_status(base_url: str) -> str | None:
    """The `status` of a 503 from /readyz; None when ready or not answering."""
    try:
        with urllib.request.urlopen(base_url + "/readyz", timeout=2.0):
            return None
    except urllib.error.HTTPError as exc:
        try:
            return str(json.loads(exc.read()).get("status"))
        except ValueError:
            return None
    except (urllib.error.URLError, OSError):
        return None


def wait_until(deadline: float) -> None:
    """Sleep until a scheduled instant: when a fault lands is the schedule's choice."""
    time.sleep(max(0.0, deadline - time.monotonic()))
