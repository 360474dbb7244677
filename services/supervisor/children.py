"""The children the supervisor keeps: which should run, starting and restarting with backoff.

Pure bookkeeping over `runtime/supervisor.Supervisor` (which owns the processes): given the runs
that are active now, start what is missing, restart what died (after 1 s, doubling up to
`backoff_max_s`, reset once a child has stayed up that long), and stop what belongs to a run that
is done or gone. Nothing here waits for a child to be ready: a run whose aggregator starts slowly
or crash-loops holds up no other run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fedasync.services.runtime.supervisor import Child, ServiceSpec, Supervisor

log = logging.getLogger(__name__)

#: the first wait before restarting a child that died, seconds (then doubling)
FIRST_BACKOFF_S = 1.0


@dataclass(slots=True)
class Kept:
    """One child the supervisor keeps, and its restart schedule."""

    run: str
    role: str
    spec: ServiceSpec
    port: int
    backoff_s: float = FIRST_BACKOFF_S
    next_start: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    last_exit: int | None = None
    history: list[int] = field(default_factory=list)


class Children:
    """The children of every active run, kept running by `reconcile`."""

    def __init__(
        self,
        processes: Supervisor,
        backoff_max_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.processes = processes
        self.kept: dict[str, Kept] = {}
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        #: called with (run, role) at each restart (the metrics' counter)
        self.on_restart: Callable[[str, str], None] = lambda run, role: None

    def keep(self, run: str, role: str, spec: ServiceSpec, port: int) -> None:
        """Keep `spec` running from now on (started at the next `reconcile`)."""
        if spec.name not in self.kept:
            self.kept[spec.name] = Kept(run, role, spec, port)

    def child(self, name: str) -> Child | None:
        return self.processes.children.get(name)

    def reconcile(self) -> None:
        """Start every kept child that is not running and whose backoff has passed."""
        now = self._clock()
        for name, kept in self.kept.items():
            child = self.child(name)
            if child is not None and child.running():
                if now - kept.started_at >= self._backoff_max_s:
                    kept.backoff_s = FIRST_BACKOFF_S
                continue
            if child is not None and kept.next_start == 0.0:
                # seen dead for the first time: note why, and when to try again
                code = child.process.returncode
                kept.last_exit = code
                kept.history.append(code)
                kept.next_start = now + kept.backoff_s
                log.warning(
                    "%s exited with code %s; restarting in %.0f s; last lines of %s:\n%s",
                    name,
                    code,
                    kept.backoff_s,
                    child.log_path,
                    child.log_tail(5),
                )
                kept.backoff_s = min(kept.backoff_s * 2, self._backoff_max_s)
            if now < kept.next_start:
                continue
            if child is not None:
                kept.restarts += 1
                self.on_restart(kept.run, kept.role)
            self.processes.start(kept.spec)
            kept.started_at, kept.next_start = now, 0.0
            log.info("%s started (pid %d)", name, self.processes.children[name].pid)

    def release(self, runs: Iterable[str]) -> list[Child]:
        """Stop keeping the children of `runs`; the running ones, for the caller to stop."""
        gone = set(runs)
        running = []
        for name in [n for n, k in self.kept.items() if k.run in gone]:
            del self.kept[name]
            child = self.processes.children.pop(name, None)
            if child is not None and child.running():
                child.expected_exit = True
                running.append(child)
        return running

    def runs(self) -> set[str]:
        return {kept.run for kept in self.kept.values()}
