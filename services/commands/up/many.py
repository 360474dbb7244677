"""`fedasync up --runs N` (or `--runs-file runs.toml`): several runs at once on one Redis.

One snapshot, one control and (with `--secure`) one ingest service serve every run; each run
gets an aggregator, an evaluator and a fleet of its own, under its own key prefix (its run id).
The first run is the default run (the legacy routes serve it); the others are `<prefix>-2`,
`<prefix>-3`, ..., each trained from seed + i, or whatever the runs file says. Each run is
watched through its control routes (`/v1/runs/<id>/status`) and ends on its own budget; `up`
ends once every run has, and writes one run folder per run (`<out>/<run>/`, the same files as a
single run's) and one table of them all.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedasync.services.commands.up.interrupts import Interrupts
from fedasync.services.commands.up.plan import BUDGETS, HOST, Ports, configure, worker_specs
from fedasync.services.commands.up.report import write_run_folder
from fedasync.services.commands.up.view import num
from fedasync.services.runtime.ports import free_port
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.run_settings import settings_for_run
from fedasync.services.runtime.settings import Settings, settings_env
from fedasync.services.runtime.supervisor import ChildFailed, ServiceSpec, Supervisor
from fedasync.services.stores.device_keys import ED25519, add_device
from fedasync.services.stores.policy_store import NoPolicy
from fedasync.services.stores.runs import create_run
from fedasync.services.worker.device import default_client_id
from fedasync.shared.keys import Keys
from fedasync.shared.runs import RunSpec, TaskSpec, run_path

#: the services every run shares, in start order (ingest only with --secure)
SHARED = ("snapshot", "control", "ingest")
REFRESH_S = 1.0
PLAIN_EVERY_S = 5.0
#: how long after its end a run's evaluator may take to score its final version
FINAL_EVALUATION_S = 30.0


class RunsFileError(ValueError):
    """A runs file that cannot be read: one line naming the file and the problem."""


@dataclass(slots=True)
class OneRun:
    """One of the runs: its settings (prefix, task, policy, budget, its own ports)."""

    id: str
    settings: Settings
    default: bool
    status: dict[str, Any] | None = None
    ended_by: str | None = None
    done_at: float | None = None

    @property
    def keys(self) -> Keys:
        return Keys(self.id)


def read_runs_file(path: Path) -> list[RunSpec]:
    """The `[[run]]` tables of a TOML file, each a run spec (shared/runs.py)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RunsFileError(f"{path}: {exc}") from None
    tables = data.get("run")
    if not isinstance(tables, list) or not tables:
        raise RunsFileError(f"{path}: no [[run]] table")
    specs = []
    for index, table in enumerate(tables, 1):
        try:
            specs.append(RunSpec.from_dict(table))
        except ValueError as exc:
            raise RunsFileError(f"{path}: run {index}: {exc}") from None
    ids = [spec.id for spec in specs]
    if len(set(ids)) != len(ids):
        raise RunsFileError(f"{path}: a run id appears twice")
    return specs


def plan_runs(base: Settings, count: int, specs: list[RunSpec] | None) -> list[OneRun]:
    """The runs to start: `count` copies of `base` (seed + i, ids `<prefix>`, `<prefix>-2`, ...)
    or the runs file's specs (the first is the default run, whatever its id)."""
    prefix = base.redis.key_prefix
    out = []
    if specs is None:
        for i in range(count):
            run = prefix if i == 0 else f"{prefix}-{i + 1}"
            task = base.task.model_copy(update={"seed": base.task.seed + i})
            redis = base.redis.model_copy(update={"key_prefix": run})
            # a named run's processes speak for it (services/runtime/own_run.py)
            auth = base.auth.model_copy(update={"default_run": None if i == 0 else prefix})
            changes = {"task": task, "redis": redis, "auth": auth}
            out.append(OneRun(run, base.model_copy(update=changes), i == 0))
        return out
    # the first run is the default run: the others name it (auth.default_run)
    redis = base.redis.model_copy(update={"key_prefix": specs[0].id})
    base = base.model_copy(update={"redis": redis})
    for i, spec in enumerate(specs):
        if spec.task.num_devices is None:
            fleet = dataclasses.replace(spec.task, num_devices=base.task.num_devices)
            spec = dataclasses.replace(spec, task=fleet)
        out.append(OneRun(spec.id, settings_for_run(base, spec), i == 0))
    return out


def _own_ports(run: OneRun) -> OneRun:
    agg, ev = free_port(), free_port()
    s = run.settings
    run.settings = s.model_copy(
        update={
            "aggregator": s.aggregator.model_copy(update={"host": HOST, "port": agg}),
            "evaluator": s.evaluator.model_copy(update={"host": HOST, "port": ev}),
        }
    )
    return run


def _spec(name: str, module: str, settings: Settings, ready: str | None) -> ServiceSpec:
    return ServiceSpec(name, f"fedasync.services.{module}", settings_env(settings), ready)


def run_many(
    args: argparse.Namespace,
    console: Console,
    settings: Settings,
    out: Path,
    redis_url: str | None,
    interrupts: Interrupts,
) -> tuple[int, list[dict[str, Any]]]:
    """Start, watch and record every run; the exit code and each run's summary."""
    specs = read_runs_file(args.runs_file) if args.runs_file else None
    ports = Ports.free()
    base = configure(settings, redis_url, settings.redis.key_prefix, ports, secure=args.secure)
    runs = [_own_ports(run) for run in plan_runs(base, args.runs, specs)]
    base = runs[0].settings  # the default run's settings serve the shared services
    started = time.monotonic()
    problems: list[str] = []
    with Supervisor(out / "logs") as supervisor:
        try:
            asyncio.run(_create(runs))
            # the aggregators first (each commits its run's genesis, which the shared services
            # serve and are ready on), then the shared services, then the evaluators
            for role in ("aggregator", None, "evaluator"):
                if role is None:
                    _start_shared(supervisor, base, ports, interrupts)
                    continue
                for run in runs:
                    port = getattr(run.settings, role).port
                    ready = f"http://{HOST}:{port}/readyz"
                    supervisor.start(_spec(f"{run.id}.{role}", role, run.settings, ready))
                for run in runs:
                    supervisor.wait_ready(f"{run.id}.{role}", 60, interrupts.check)
            _header(console, base, ports, runs, out)
            for run in runs:
                keys = asyncio.run(provision_devices(run.settings)) if args.secure else {}
                for spec in worker_specs(run.settings, ports, keys):
                    supervisor.start(dataclasses.replace(spec, name=f"{run.id}.{spec.name}"))
            _watch(console, base, ports, runs, supervisor, interrupts, started, problems)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping every process[/yellow]")
            for run in runs:
                run.ended_by = run.ended_by or "interrupted"
        except ChildFailed as exc:
            problems.append(str(exc))
            console.print(f"[red]{escape(str(exc))}[/red]")
        finally:
            interrupts.ignore()
            names = list(supervisor.children)
            supervisor.stop_all(
                groups=[
                    [n for n in names if ".worker-" in n],
                    [n for n in names if n.endswith(".evaluator")] + ["ingest", "control"],
                    ["snapshot"],
                    [n for n in names if n.endswith(".aggregator")],
                ]
            )
    summaries = []
    for run in runs:
        folder = out / run.id
        folder.mkdir(parents=True, exist_ok=True)
        try:
            summary = asyncio.run(
                write_run_folder(
                    run.settings,
                    folder,
                    ended_by=run.ended_by or "failed",
                    wall_seconds=time.monotonic() - started,
                    extra={"problems": list(problems), "run": run.id},
                )
            )
        except (RedisError, OSError, NoPolicy) as exc:
            problems.append(f"run folder of {run.id} not written: {exc}")
            continue
        summaries.append(summary)
    _table(console, runs, summaries, out, problems)
    ok = len(summaries) == len(runs) and all(
        s["ended_by"] in BUDGETS and not s["problems"] for s in summaries
    )
    return (0 if ok and not problems else 1), summaries


def _start_shared(
    supervisor: Supervisor, base: Settings, ports: Ports, interrupts: Interrupts
) -> None:
    """snapshot, control and (devices signing) ingest, each ready before the next."""
    for name in SHARED:
        if name == "ingest" and not base.auth.required:
            continue
        port = getattr(ports, name)
        supervisor.start(_spec(name, name, base, f"http://{HOST}:{port}/readyz"))
        supervisor.wait_ready(name, timeout=60, between=interrupts.check)


async def _create(runs: list[OneRun]) -> None:
    """Every run but the default one is created (listed in the directory, found by the shared
    services before its aggregator's first start)."""
    redis = connect(runs[0].settings.redis)
    try:
        for run in runs[1:]:
            task = run.settings.task
            spec = RunSpec(
                run.id,
                TaskSpec(task.name, dict(task.params), task.seed, task.num_devices),
                created_at=time.time(),
                created_by="fedasync up",
            )
            await create_run(redis, spec)
    finally:
        await redis.aclose()


async def provision_devices(settings: Settings) -> dict[str, str]:
    """A key of its own for every device of the run (`fedasync devices add`, done for the fleet):
    Ed25519, so Redis holds only the public keys and the private ones live in the workers'
    environment; a device of one run is unknown in the others."""
    redis = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        return {
            default_client_id(i): await add_device(redis, keys, default_client_id(i), ED25519)
            for i in range(settings.task.num_devices)
        }
    finally:
        await redis.aclose()


def _get(base: Settings, ports: Ports, path: str) -> Any:
    headers = {"Authorization": f"Bearer {base.control.token}"}
    request = urllib.request.Request(ports.url("control") + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2.0) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _watch(
    console: Console,
    base: Settings,
    ports: Ports,
    runs: list[OneRun],
    supervisor: Supervisor,
    interrupts: Interrupts,
    started: float,
    problems: list[str],
) -> None:
    last_line = 0.0
    while True:
        for child in supervisor.exited():
            if not child.expected_exit and ".worker-" not in child.spec.name:
                raise ChildFailed(
                    f"{child.spec.name} stopped (exit code {child.process.returncode}); see "
                    f"{child.log_path}:\n{child.log_tail(8)}"
                )
        for run in runs:
            if run.ended_by is not None:
                continue
            path = "/v1/status" if run.default else run_path(run.id, "/v1/status")
            run.status = _get(base, ports, path) or run.status
            done = (run.status or {}).get("training_done")
            if done is None:
                continue
            run.done_at = run.done_at or time.monotonic()
            evaluation = (run.status or {}).get("evaluation") or {}
            if evaluation.get("version", -1) >= int(done["version"]):
                run.ended_by = str(done["reason"])
            elif time.monotonic() - run.done_at > FINAL_EVALUATION_S:
                problems.append(f"{run.id}: the evaluator did not score the final version in time")
                run.ended_by = str(done["reason"])
        elapsed = time.monotonic() - started
        finished = all(run.ended_by is not None for run in runs)
        if finished or elapsed - last_line >= PLAIN_EVERY_S:
            console.print(_line(runs, elapsed), highlight=False, soft_wrap=True)
            last_line = elapsed
        if finished:
            return
        interrupts.sleep(REFRESH_S)


def _line(runs: list[OneRun], elapsed: float) -> str:
    parts = []
    for run in runs:
        status = run.status or {}
        accuracy = (status.get("evaluation") or {}).get("score")
        state = run.ended_by or f"v{status.get('version', '–')}"
        parts.append(f"{run.id} {state} acc {num(accuracy, 3)}")
    return f"{elapsed:5.0f} s  " + " · ".join(parts)


def _header(console: Console, base: Settings, ports: Ports, runs: list[OneRun], out: Path) -> None:
    console.print(
        f"[bold]fedasync up[/bold]: {len(runs)} runs, each with its own aggregator, evaluator "
        "and devices; one snapshot, control and ingest service for all",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"  {'dashboard':<11} {ports.url('control')}/  operator token: {base.control.token}",
        highlight=False,
        soft_wrap=True,
    )
    for run in runs:
        task = run.settings.task
        where = ports.url("snapshot") + ("" if run.default else f"/v1/runs/{run.id}")
        console.print(
            f"  {run.id:<11} task {task.name} (seed {task.seed}), {task.num_devices} devices, "
            f"models at {where}/models/latest",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"  {'run folder':<11} {out}", highlight=False, soft_wrap=True)


def _table(
    console: Console,
    runs: list[OneRun],
    summaries: list[dict[str, Any]],
    out: Path,
    problems: list[str],
) -> None:
    table = Table(title=f"fedasync up: {len(runs)} runs", title_justify="left")
    for column in ("run", "ended by", "version", "applied", "accuracy", "folder"):
        table.add_column(column)
    for summary in summaries:
        final = summary.get("final") or {}
        table.add_row(
            summary["run"],
            summary["ended_by"],
            str(summary["version"]),
            str(summary["updates"]["applied"]),
            num(final.get("score"), 3),
            str(out / summary["run"]),
        )
    console.print(table)
    for problem in problems:
        console.print(f"[red]problem: {escape(problem)}[/red]")
