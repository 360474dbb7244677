"""Injecting faults into the running system, and recovering from them as a supervisor would.

A kill is a SIGKILL (no cleanup runs), followed after a short outage by a start with the same
settings; Redis comes back from its append-only file on the same port and directory. A pause is
`CLIENT PAUSE <ms> ALL`: Redis holds every client's commands while their sockets time out.
Children that exit when nobody asked them to (e.g. an aggregator that found Redis gone while
starting) are restarted too, after a short back-off, and counted: the run reports them.

Each Redis kill is checked (chaos/restarts.py): what Redis held just before the kill, with
writes paused, must be there just after the restart.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from fedasync.services.commands.chaos.restarts import RestartCheck, compare, read_marks
from fedasync.services.commands.chaos.schedule import Fault, FaultKind
from fedasync.services.commands.chaos.system import (
    AGGREGATOR,
    KEEP_VERSIONS,
    SNAPSHOT,
    System,
    worker_name,
)

#: least time between a child's unexpected exit and its restart, seconds (a supervisor's back-off)
RESTART_BACKOFF_S = 0.5
REDIS = "redis"


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
        self.injected[fault.kind.value] += 1
        self.events.append(Event(now, fault.kind.value, fault.describe()))

    def _kill_redis(self, now: float) -> None:
        """Read what Redis holds (writes stay paused), then SIGKILL it."""
        check = RestartCheck(now)
        try:
            check.before = read_marks(self.system.observer_url, self.system.keys, unpause=False)
        except (redis.RedisError, OSError) as exc:
            check.problems.append(f"no reading before the kill: {exc}")
        self.restarts.append(check)
        self.system.redis.kill()

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

    def _pause(self, fault: Fault, now: float) -> None:
        client = self.system.observer(socket_timeout=5.0)
        try:
            client.client_pause(int(fault.outage_s * 1000), all=True)
        except redis.RedisError as exc:
            self._skip(fault, now, f"CLIENT PAUSE failed: {exc}")
            return
        finally:
            client.close()
        self.injected[fault.kind.value] += 1
        self.events.append(Event(now, fault.kind.value, fault.describe()))

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

    def restart_exited(self, names: list[str]) -> None:
        """Children of `names` that exited unasked: count them and start them after a back-off."""
        now = self.now()
        down_on_purpose = {name for _, name in self.pending}
        for name in names:
            child = self.system.supervisor.children.get(name)
            if child is None or child.running() or child.expected_exit:
                continue
            if name in down_on_purpose:
                continue
            first_seen = self._exited_at.setdefault(name, now)
            if now - first_seen < RESTART_BACKOFF_S:
                continue
            del self._exited_at[name]
            self.crashes[name] += 1
            self.events.append(
                Event(now, "crashed", f"{name} exited with {child.process.returncode}; restarted")
            )
            self._start(name)

    def _start(self, name: str) -> None:
        if name == REDIS:
            self.system.redis.start()  # replays the AOF; returns once it answers PING
            self._check_restart()
        else:
            self.system.supervisor.start(self.system.spec(name))

    def next_due(self) -> float | None:
        return min((at for at, _ in self.pending), default=None)


def wait_until(deadline: float) -> None:
    """Sleep until a scheduled instant: when a fault lands is the schedule's choice."""
    time.sleep(max(0.0, deadline - time.monotonic()))
