"""`fedasync up`: start Redis (unless one is configured), the services and a fleet; watch; report.

Children are started in dependency order, each once the previous answers /readyz, and stopped in
the reverse order: workers first, so nothing is published to a stopped aggregator. Ctrl-C (or
SIGTERM) stops everything the same way; a second Ctrl-C cannot cut that short. A child that dies
is reported with the tail of its log, never hidden: a service's death ends the run, a worker's is
listed in the summary and makes the exit code non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from fedasync.services.commands.redis_launch.server import RedisNotFound, RedisServer
from fedasync.services.commands.redis_target import redis_where
from fedasync.services.commands.up import view
from fedasync.services.commands.up.interrupts import Interrupts
from fedasync.services.commands.up.many import RunsFileError, provision_devices, run_many
from fedasync.services.commands.up.options import run_settings
from fedasync.services.commands.up.plan import (
    BUDGETS,
    SERVICES,
    Ports,
    configure,
    service_specs,
    worker_specs,
)
from fedasync.services.commands.up.report import print_summary, write_run_folder
from fedasync.services.runtime.entry import EXIT_SETTINGS
from fedasync.services.runtime.settings import ENV_PREFIX, Settings
from fedasync.services.runtime.supervisor import ChildFailed, Supervisor

#: how long after the end of training the evaluator may take to score the final version
FINAL_EVALUATION_S = 30.0
REFRESH_S = 0.5
PLAIN_EVERY_S = 5.0
#: how long every worker may be stopped before the control service says training is done
WORKERS_GONE_GRACE_S = 15.0


class Monitor:
    """Reads the control service's status, draws it, and decides when the run is over."""

    def __init__(self, settings: Settings, ports: Ports, supervisor: Supervisor) -> None:
        self.base = ports.url("control")
        self.headers = {"Authorization": f"Bearer {settings.control.token}"}
        self.supervisor = supervisor
        self.workers = [f"worker-{i}" for i in range(settings.task.num_devices)]
        self.problems: list[str] = []
        self._reported: set[str] = set()
        self.status: dict[str, Any] | None = None
        #: when every worker was first seen stopped while training was not done
        self._workers_gone_at: float | None = None
        self.alerts: list[dict[str, Any]] = []
        #: the policy in force (its pause fields), read again when its version changes
        self.policy: dict[str, Any] | None = None
        self._policy_version: int | None = None
        #: alerts already printed by the plain view
        self._printed_alerts: set[str] = set()

    def workers_running(self) -> int:
        """Device processes started and not exited (start-up shows how many there are)."""
        started = [name for name in self.workers if name in self.supervisor.children]
        return len(started) - len(self.supervisor.exited(started))

    def report_crashes(self) -> list[str]:
        """Note each child that died on its own (once); the names newly noted."""
        noted = []
        for child in self.supervisor.crashed():
            name = child.spec.name
            if name in self._reported:
                continue
            code = child.process.returncode
            # exit code 2 says it in its last line (bad settings, a task's code that failed),
            # the traceback above it in the log; any other death shows the log's tail
            tail = child.log_tail(1 if code == EXIT_SETTINGS else 8)
            problem = f"{name} crashed with exit code {code}; see {child.log_path}:\n{tail}"
            self._reported.add(name)
            self.problems.append(problem)
            noted.append(name)
        return noted

    def new_alerts(self) -> list[dict[str, Any]]:
        """The alerts not printed yet, oldest first (the plain view prints each once)."""
        fresh = [a for a in reversed(self.alerts) if str(a.get("id")) not in self._printed_alerts]
        self._printed_alerts.update(str(a.get("id")) for a in fresh)
        return fresh

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(self.base + path, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=2.0) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def poll(self) -> str | None:
        """One look at the run; the reason training ended once it has (and was evaluated)."""
        self.status = self._get("/v1/status") or self.status
        self.alerts = self._get("/v1/alerts?count=3") or self.alerts
        version = (self.status or {}).get("policy_version")
        if version is not None and version != self._policy_version:
            read = self._get("/v1/policy")
            if read is not None:
                self.policy, self._policy_version = read.get("policy"), version
        crashed = self.report_crashes()
        if any(name in SERVICES for name in crashed):
            raise ChildFailed(self.problems[-1])
        for child in self.supervisor.exited([n for n in SERVICES if n in self.supervisor.children]):
            if not child.expected_exit:  # even a clean exit: nothing would serve the run anymore
                raise ChildFailed(
                    f"{child.spec.name} stopped (exit code {child.process.returncode}) while the "
                    f"run needs it; see {child.log_path}:\n{child.log_tail(8)}"
                )
        done = (self.status or {}).get("training_done")
        if done is None and len(self.supervisor.exited(self.workers)) == len(self.workers):
            # workers stop on their own once training is done, and the status that says so may
            # be a look or two late (a slow answer counts as none): fail only after a grace
            self._workers_gone_at = self._workers_gone_at or time.monotonic()
            if time.monotonic() - self._workers_gone_at > WORKERS_GONE_GRACE_S:
                raise ChildFailed("every worker stopped before training was done")
        if done is None:
            return None
        evaluation = (self.status or {}).get("evaluation") or {}
        if evaluation.get("version", -1) >= int(done["version"]):
            return str(done["reason"])
        return None


def _watch(
    monitor: Monitor, console: Console, live: bool, started: float, interrupts: Interrupts
) -> str:
    done_at: float | None = None
    last_line = 0.0

    def finished() -> str | None:
        nonlocal done_at
        reason = monitor.poll()
        if reason is not None:
            return reason
        done = (monitor.status or {}).get("training_done")
        if done is not None:
            done_at = done_at or time.monotonic()
            if time.monotonic() - done_at > FINAL_EVALUATION_S:
                monitor.problems.append("the evaluator did not score the final version in time")
                return str(done["reason"])
        return None

    if live:
        with Live(console=console, refresh_per_second=4, transient=False) as screen:
            while True:
                reason = finished()
                elapsed = time.monotonic() - started
                screen.update(
                    view.render(
                        monitor.status,
                        monitor.alerts,
                        elapsed,
                        monitor.problems,
                        monitor.workers_running(),
                        len(monitor.workers),
                        monitor.policy,
                    )
                )
                if reason is not None:
                    return reason
                interrupts.sleep(REFRESH_S)
    while True:
        reason = finished()
        elapsed = time.monotonic() - started
        if monitor.status is not None and (reason or elapsed - last_line >= PLAIN_EVERY_S):
            shown = view.line(
                monitor.status,
                elapsed,
                monitor.workers_running(),
                len(monitor.workers),
                monitor.policy,
            )
            console.print(shown, highlight=False, soft_wrap=True)
            last_line = elapsed
        for alert in monitor.new_alerts():  # each once, as it comes
            console.print(escape(view.alert_line(alert)), highlight=False, soft_wrap=True)
        if reason is not None:
            return reason
        interrupts.sleep(REFRESH_S)


def _header(
    console: Console,
    settings: Settings,
    ports: Ports,
    out: Path,
    redis: str,
    private_url: str | None,
) -> None:
    task, worker, budget = settings.task, settings.worker, settings.budget
    console.print(
        f"[bold]fedasync up[/bold]: {task.num_devices} devices ({worker.profile}, time scale "
        f"{worker.time_scale:g}), task {task.name} ({task.partition}, seed {task.seed}), "
        f"budget {budget.max_updates} updates / {budget.max_seconds:g} s",
        highlight=False,
        soft_wrap=True,
    )
    policy = settings.policy.to_policy()
    if policy.dp_clip is not None:  # what the ε in the live view is measured against
        eps = "none" if policy.privacy_budget is None else f"{policy.privacy_budget:g}"
        console.print(
            f"differential privacy: clip C {policy.dp_clip:g}, noise z {policy.dp_noise:g}, "
            f"δ {policy.dp_delta:g}, privacy budget {eps} ({policy.privacy_model})",
            highlight=False,
            soft_wrap=True,
        )
    rows = [
        ("dashboard", ports.url("control") + "/", f"operator token: {settings.control.token}"),
        ("snapshot", ports.url("snapshot") + "/v1/models/latest", ""),
        ("evaluator", ports.url("evaluator") + "/metrics", ""),
        ("aggregator", ports.url("aggregator") + "/metrics", ""),
        *(
            [("ingest", ports.url("ingest") + "/v1/updates", "devices sign with their own keys")]
            if settings.auth.required
            else []
        ),
        ("redis", redis, ""),
        ("run folder", str(out), "logs in logs/"),
    ]
    for name, where, note in rows:
        console.print(f"  {name:<11} {where}  {note}", highlight=False, soft_wrap=True)
    if settings.auth.required and private_url is not None:
        # a device of the user's own joins the run with a key of its own, while the run lasts
        console.print(
            f"  {'a device':<11} FEDASYNC_REDIS__URL={private_url} fedasync devices add ID  "
            "prints its key (docs/device-client.md)",
            highlight=False,
            soft_wrap=True,
        )


@dataclass(frozen=True, slots=True)
class _RunRedis:
    """The run's Redis: a private redis-server the run started (`server`), or the configured
    one (`server` None), with the key prefix the run uses and what the header says of it."""

    server: RedisServer | None
    url: str | None
    prefix: str
    where: str


def _run_redis(settings: Settings, out: Path, stamp: str) -> _RunRedis:
    """A private redis-server (its AOF in the run folder) unless a Redis is configured; on a
    configured one, a key prefix of the run's own unless one is set. RedisNotFound: no
    redis-server to start."""
    if not settings.redis.configured:
        server = RedisServer(out / "redis")
        server.start()
        where = f"{server.url}  private redis-server, no password (AOF in {out / 'redis'})"
        return _RunRedis(server, server.url, settings.redis.key_prefix, where)
    explicit = f"{ENV_PREFIX}REDIS__KEY_PREFIX" in os.environ
    prefix = settings.redis.key_prefix if explicit else f"up-{stamp}"  # a run of its own
    where = f"{redis_where(settings.redis)} (configured), key prefix {prefix}"
    return _RunRedis(None, settings.redis.url, prefix, where)


def run_up(args: argparse.Namespace) -> int:
    console = Console()
    settings = run_settings(args)  # the task built too: one line, exit 2, nothing started
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("runs") / f"up-{stamp}"
    if out.exists() and any(out.iterdir()):
        # its redis/ would bring the old run back (done flag and all) and its report be mixed in
        console.print(
            f"[red]fedasync up: {escape(str(out))} is not empty; choose a new --out[/red]"
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        redis = _run_redis(settings, out, stamp)
    except RedisNotFound as exc:
        console.print(f"[red]fedasync up: {escape(str(exc))}[/red]")
        return 2
    if args.runs > 1 or args.runs_file is not None:
        return _many(args, console, settings, out, redis)
    ports = Ports.free()
    settings = configure(settings, redis.url, redis.prefix, ports, secure=args.secure)
    started = time.monotonic()
    interrupts = Interrupts()
    with interrupts.installed():  # until the run folder is written and Redis stopped
        try:
            ended_by, problems = _supervised(
                args, console, settings, ports, out, redis, interrupts, started
            )
            summary = _record(console, settings, out, ended_by, started, problems)
            if summary is None:
                return 1
            print_summary(console, summary, out)
        finally:
            if redis.server is not None:
                redis.server.stop()
    return 0 if ended_by in BUDGETS and not summary["problems"] else 1


def _many(
    args: argparse.Namespace, console: Console, settings: Settings, out: Path, redis: _RunRedis
) -> int:
    """`--runs N` or `--runs-file`: several runs on this Redis (commands/up/many.py)."""
    prefixed = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"key_prefix": redis.prefix})}
    )
    interrupts = Interrupts()
    with interrupts.installed():
        try:
            code, _ = run_many(args, console, prefixed, out, redis.url, interrupts)
        except RunsFileError as exc:
            console.print(f"[red]fedasync up: {escape(str(exc))}[/red]")
            code = 2
        finally:
            if redis.server is not None:
                redis.server.stop()
    return code


def _supervised(
    args: argparse.Namespace,
    console: Console,
    settings: Settings,
    ports: Ports,
    out: Path,
    redis: _RunRedis,
    interrupts: Interrupts,
    started: float,
) -> tuple[str, list[str]]:
    """Start the services (each ready before the next), then the workers; watch until training
    ends, a child fails or Ctrl-C; stop every child in order. How the run ended, and the
    problems seen."""
    ended_by = "failed"
    with Supervisor(out / "logs") as supervisor:  # children: the run's settings only
        monitor = Monitor(settings, ports, supervisor)
        try:
            for spec in service_specs(settings, ports):
                interrupts.check()
                supervisor.start(spec)
                supervisor.wait_ready(spec.name, timeout=60, between=interrupts.check)
            private_url = None if redis.server is None else redis.server.url
            _header(console, settings, ports, out, redis.where, private_url)
            device_keys = asyncio.run(provision_devices(settings)) if args.secure else {}
            for spec in worker_specs(settings, ports, device_keys):
                interrupts.check()
                supervisor.start(spec)
            console.print(
                f"  {'workers':<11} {settings.task.num_devices} device processes started; "
                "Ctrl-C stops everything",
                highlight=False,
                soft_wrap=True,
            )
            live = not args.no_live and console.is_terminal
            ended_by = _watch(monitor, console, live, started, interrupts)
        except KeyboardInterrupt:
            ended_by = "interrupted"
            console.print("[yellow]interrupted: stopping every process[/yellow]")
        except ChildFailed as exc:
            if str(exc) not in monitor.problems:
                monitor.problems.append(str(exc))
            console.print(f"[red]{escape(str(exc))}[/red]")
        finally:
            interrupts.ignore()  # a second Ctrl-C must not cut the cleanup short
            workers = [n for n in supervisor.children if n.startswith("worker-")]
            # workers first (nothing more is published), the aggregator last
            supervisor.stop_all(
                groups=[
                    workers,
                    ["ingest", "evaluator", "control", "snapshot"],
                    ["aggregator"],
                ]
            )
            monitor.report_crashes()  # a death the last look did not see
    return ended_by, monitor.problems


def _record(
    console: Console,
    settings: Settings,
    out: Path,
    ended_by: str,
    started: float,
    problems: list[str],
) -> dict[str, Any] | None:
    """Write the run folder (ledger, figures, the settings worth keeping); None, with the
    problems and why printed, if Redis could not give what it needs."""
    try:
        return asyncio.run(
            write_run_folder(
                settings,
                out,
                ended_by=ended_by,
                wall_seconds=time.monotonic() - started,
                extra={"problems": problems, "settings": _shown(settings)},
            )
        )
    except (RedisError, OSError) as exc:
        for problem in problems:
            console.print(f"[red]problem: {escape(problem)}[/red]")
        console.print(f"[red]run folder not written: Redis: {escape(str(exc))}[/red]")
        return None


def _shown(settings: Settings) -> dict[str, Any]:
    """The settings worth keeping with the results (no URL, no token)."""
    return {
        "task": settings.task.model_dump(mode="json"),
        "policy": settings.policy.model_dump(mode="json"),
        "budget": settings.budget.model_dump(mode="json"),
        "auth": {"required": settings.auth.required},
        "worker": {
            "profile": settings.worker.profile,
            "time_scale": settings.worker.time_scale,
        },
    }
