"""Run fedasync's services as child processes: start, wait until ready, kill, restart, stop all.

One implementation shared by `fedasync up` (a whole system on one machine) and the chaos harness
(which kills and restarts children on purpose). Each child runs `python -m <module>` with its own
log file and its own session, so a Ctrl-C at the terminal reaches only the parent, which then
stops the children in order (workers first, Redis-facing services last). On Linux each child also
asks the kernel to SIGKILL it should the parent die, so even a kill -9 of the parent leaves
nothing running.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from fedasync.services.runtime.settings import ENV_PREFIX

_PR_SET_PDEATHSIG = 1

#: how long a process stop_process stops has to exit after SIGTERM before its SIGKILL, seconds
TERM_GRACE_S = 10.0


class ChildFailed(RuntimeError):
    """A child exited when it should be running (its log file says why)."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to start one child: `python -m module` with `env` on top of the parent's environment."""

    name: str
    module: str
    env: Mapping[str, str] = field(default_factory=dict)
    #: polled until it answers 200; None: ready as soon as it runs
    ready_url: str | None = None


@dataclass(slots=True)
class Child:
    spec: ServiceSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    starts: int = 1
    #: set when the supervisor stopped or killed it on purpose
    expected_exit: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGKILL this child when the parent dies; elsewhere a no-op.

    The kernel's "parent" is the thread that started the child: start children from a thread
    that lives as long as they should (the main thread, in every caller here).
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class StopsOnExit(ABC):
    """A context manager that is itself (`with X(...) as x`) and calls `stop()` on leaving the
    block however it is left: nothing it started outlives it (a Supervisor, the chaos system)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop everything this object started; safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class Supervisor(StopsOnExit):
    """The children of one run; a context manager that stops every child on exit."""

    def __init__(
        self, log_dir: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        """`env` is added to this process's environment, from which every FEDASYNC_ variable is
        left out: a child's settings are exactly those its caller and its spec give (a stray
        FEDASYNC_WORKER__KEY in the operator's shell must not reach a run's workers)."""
        self.log_dir = log_dir
        inherited = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
        self.env = inherited | dict(env or {})
        self.cwd = cwd
        self.children: dict[str, Child] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        """Every child, newest first (what leaving the `with` block does)."""
        self.stop_all()

    # ------------------------------------------------------------------------------ starting
    def start(self, spec: ServiceSpec) -> Child:
        previous = self.children.get(spec.name)
        if previous is not None and previous.running():
            raise ChildFailed(f"{spec.name} is already running (pid {previous.pid})")
        log_path = self.log_dir / f"{spec.name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", spec.module],
                env=self.env | dict(spec.env),
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        starts = previous.starts + 1 if previous is not None else 1
        child = Child(spec, process, log_path, starts=starts)
        self.children[spec.name] = child
        return child

    def wait_ready(
        self, name: str, timeout: float = 30.0, between: Callable[[], None] | None = None
    ) -> None:
        """Poll the child's readiness URL until it answers 200; fail fast if the child exits.

        `between` runs before each look: a caller's way to give up early (by raising), e.g. on a
        Ctrl-C it noted but has not acted on yet.
        """
        child = self.children[name]
        deadline = time.monotonic() + timeout
        while True:
            if between is not None:
                between()
            if not child.running():
                raise ChildFailed(
                    f"{name} exited with code {child.process.returncode} while starting; "
                    f"last lines of {child.log_path}:\n{child.log_tail()}"
                )
            if child.spec.ready_url is None or _answers_ok(child.spec.ready_url):
                return
            if time.monotonic() > deadline:
                raise ChildFailed(
                    f"{name} not ready after {timeout:.0f} s ({child.spec.ready_url}); "
                    f"last lines of {child.log_path}:\n{child.log_tail()}"
                )
            time.sleep(0.05)

    # ------------------------------------------------------------------------------- faults
    def kill(self, name: str, sig: int = signal.SIGKILL, wait: float = 10.0) -> int | None:
        """Send `sig` (default: a crash) and wait for the exit; the exit code, None if alive."""
        child = self.children[name]
        child.expected_exit = True
        if child.running():
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(sig)
        try:
            return child.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def rename(self, name: str, new_name: str) -> Child:
        """Keep a running child under another name, so a new one can start under its own (the
        chaos harness's second aggregator); its log file stays where it was."""
        if new_name in self.children:
            raise ValueError(f"{new_name} is already a child")
        child = self.children.pop(name)
        self.children[new_name] = child
        return child

    def restart(self, name: str, sig: int = signal.SIGKILL) -> Child:
        """Kill (by default with SIGKILL) and start again with the same spec and log file."""
        self.kill(name, sig)
        return self.start(self.children[name].spec)

    def crashed(self) -> list[Child]:
        """Children that exited on their own with a non-zero code (a failure to report)."""
        return [
            child
            for child in self.children.values()
            if not child.expected_exit and child.process.poll() not in (None, 0)
        ]

    def exited(self, names: list[str] | None = None) -> list[Child]:
        """Children (of `names`, or all) that are no longer running, whatever the reason."""
        chosen = self.children.values() if names is None else [self.children[n] for n in names]
        return [child for child in chosen if not child.running()]

    # ------------------------------------------------------------------------------ stopping
    def stop_all(
        self, timeout: float = 15.0, groups: list[list[str]] | None = None
    ) -> dict[str, int]:
        """SIGTERM the children group by group and wait; SIGKILL what outlives `timeout`.

        A group is signalled at once and waited for as a whole (e.g. every worker), and the next
        group only once it is gone; children in no group go last, newest first. Returns each
        child's exit code. Safe to call twice.
        """
        groups = [list(g) for g in groups or []]
        grouped = {name for group in groups for name in group}
        groups += [[n] for n in reversed(self.children) if n not in grouped]
        codes: dict[str, int] = {}
        for group in groups:
            children = [self.children[name] for name in group if name in self.children]
            for child in children:
                if child.running():
                    child.expected_exit = True
                    with contextlib.suppress(ProcessLookupError):
                        child.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in children:
                try:
                    codes[child.spec.name] = child.process.wait(
                        timeout=max(deadline - time.monotonic(), 0.0)
                    )
                except subprocess.TimeoutExpired:
                    child.process.kill()
                    codes[child.spec.name] = child.process.wait()
        return codes


def stop_process(process: subprocess.Popen[Any] | None, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM one process (a Redis server, a Sentinel) and wait for it; SIGKILL it if it
    outlives `grace_s`. None: nothing to stop."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
