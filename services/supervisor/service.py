"""The supervisor service: read the run directory, keep each active run's processes running.

Every `poll_s` it lists the runs (the directory and the default run), reads each one's spec and
status in the run's own slot, and reconciles: a created, training or paused run gets its
aggregator (and evaluator) started; a dead child is restarted with backoff; a done run's
children are stopped `done_grace_s` after it ended (its last commit and score land first); a run
that left the directory has its children stopped at once. A run without a spec that is not the
default run was not created through the control API: its processes are someone else's.

HTTP: /livez, /readyz (Redis answers and the loop runs), /metrics, and /v1/aggregators (each
run's children: pid, port, starts, running, last exit code), for operators and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import (
    BACKGROUND,
    http_service,
    livez,
    redis_readiness,
)
from fedasync.services.runtime.lifecycle import Background
from fedasync.services.runtime.openapi_parts import operational_document
from fedasync.services.runtime.ports import free_port
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.settings import Settings, SettingsError
from fedasync.services.runtime.supervisor import Supervisor
from fedasync.services.stores.runs import list_runs, read_spec, run_status
from fedasync.services.supervisor.children import Children
from fedasync.services.supervisor.metrics import SupervisorMetrics
from fedasync.services.supervisor.specs import RunPorts, run_specs
from fedasync.shared.keys import REGISTRY as RUN_REGISTRY
from fedasync.shared.keys import Keys
from fedasync.shared.runs import RunSpec, RunStatus, is_run_id

log = logging.getLogger(__name__)

ACTIVE = (RunStatus.CREATED, RunStatus.TRAINING, RunStatus.PAUSED)


class RunSupervisor:
    """The loop of the supervisor service (module docstring)."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, log_dir: Path) -> None:
        self.settings = settings
        self.cfg = settings.supervisor
        self.default = settings.redis.key_prefix
        self.clients = RunClients(redis, settings.redis, self.default)
        self.processes = Supervisor(log_dir)
        self.children = Children(self.processes, self.cfg.restart_backoff_max_s)
        self.metrics = SupervisorMetrics()
        self.children.on_restart = self.metrics.restarted
        self.status: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self._done_at: dict[str, float] = {}
        self._targets: str | None = None
        self.stopping = asyncio.Event()
        self.passes = 0

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.reconcile()
            except TRANSIENT as exc:
                log.warning("cannot read the runs now (%s); the children keep running", exc)
            self.passes += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.cfg.poll_s)

    async def reconcile(self) -> None:
        """One pass: read every run, start, restart and stop children to match."""
        runs = await list_runs(self.clients.shared, self.default)
        if self.cfg.skip_default:
            runs = runs[1:]
        listed = set(runs)
        for run in runs:
            await self._look_at(run)
        gone = self.children.runs() - listed
        if gone:
            await self._stop(gone, "left the run directory")
        self.children.reconcile()
        self.metrics.observe(self.status, self.children)
        self._write_targets()

    async def _look_at(self, run: str) -> None:
        redis = self.clients.for_run(run)
        spec: RunSpec | None = None
        if run != self.default:
            if not is_run_id(run):
                return
            spec = await read_spec(redis, run)
            if spec is None:
                self.status[run] = "unmanaged"
                return
        status = await run_status(redis, Keys(run))
        self.status[run] = status.value
        if status in ACTIVE:
            self._done_at.pop(run, None)
            self._keep(run, spec)
            return
        ended = self._done_at.setdefault(run, time.monotonic())
        if run in self.children.runs() and time.monotonic() - ended >= self.cfg.done_grace_s:
            await self._stop([run], "done")

    def _keep(self, run: str, spec: RunSpec | None) -> None:
        if run in self.children.runs() or run in self.refused:
            return
        ports = RunPorts(free_port(), free_port())
        try:
            specs = run_specs(self.settings, run, spec, ports, evaluator=self.cfg.evaluators)
        except SettingsError as exc:
            # a spec the settings refuse: say so once, start nothing (creating it checked it)
            self.refused[run] = str(exc)
            log.error("run %s: not started: %s", run, exc)
            return
        for service in specs:
            role = service.name.rsplit(".", 1)[1]
            port = ports.aggregator if role == "aggregator" else ports.evaluator
            self.children.keep(run, role, service, port)

    async def _stop(self, runs: Any, why: str) -> None:
        stopping = self.children.release(runs)
        for child in stopping:
            log.info("stopping %s (pid %d): its run %s", child.spec.name, child.pid, why)
        await asyncio.to_thread(_terminate, stopping)

    def _write_targets(self) -> None:
        path = self.cfg.targets_file
        if path is None:
            return
        # the children listen on the supervisor's host: Prometheus in another container or
        # machine reaches them by a name of that host (targets_host), not by their bind address
        binds = {
            "aggregator": self.settings.aggregator.host,
            "evaluator": self.settings.evaluator.host,
        }
        targets = [
            {
                "targets": [f"{self.cfg.targets_host or binds[kept.role]}:{kept.port}"],
                "labels": {"run": kept.run, "role": kept.role},
            }
            for kept in self.children.kept.values()
        ]
        text = json.dumps(targets, indent=1, sort_keys=True)
        if text == self._targets:
            return
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)  # Prometheus never reads half a file
        self._targets = text

    def describe(self) -> dict[str, Any]:
        """What /v1/aggregators answers."""
        runs: dict[str, Any] = {r: {"status": s, "children": {}} for r, s in self.status.items()}
        for name, kept in self.children.kept.items():
            child = self.children.child(name)
            entry = runs.setdefault(kept.run, {"status": None, "children": {}})
            entry["children"][kept.role] = {
                "pid": child.pid if child is not None else None,
                "running": child is not None and child.running(),
                "port": kept.port,
                "starts": child.starts if child is not None else 0,
                "restarts": kept.restarts,
                "last_exit": kept.last_exit,
            }
        for run, why in self.refused.items():
            runs.setdefault(run, {"status": None, "children": {}})["refused"] = why
        return {"runs": runs, "passes": self.passes}

    async def aclose(self) -> None:
        await asyncio.to_thread(self.processes.stop_all)
        await self.clients.aclose()


def _terminate(children: list[Any]) -> None:
    for child in children:
        child.process.terminate()
    for child in children:
        try:
            child.process.wait(timeout=15)
        except subprocess.TimeoutExpired:  # a child that will not stop is killed
            child.process.kill()
            child.process.wait()


SUPERVISOR = web.AppKey("supervisor", RunSupervisor)


def create_app(settings: Settings, redis: aioredis.Redis) -> web.Application:
    log_dir = settings.supervisor.log_dir
    if log_dir is None:
        log_dir = Path(tempfile.mkdtemp(prefix="fedasync-supervisor-"))
    log.info("children's logs in %s", log_dir)
    supervisor = RunSupervisor(settings, redis, log_dir)
    background = Background()
    app = web.Application(middlewares=[json_errors])
    app[SUPERVISOR] = supervisor
    app[REGISTRY] = supervisor.metrics.registry
    app[BACKGROUND] = background

    async def readyz(request: web.Request) -> web.Response:
        return await redis_readiness(redis, background, key=RUN_REGISTRY)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return metrics_response(supervisor.metrics.registry)

    async def aggregators(request: web.Request) -> web.Response:
        return web.json_response(supervisor.describe())

    async def supervise(app: web.Application) -> AsyncIterator[None]:
        background.start(supervisor.run(), "supervise-runs")
        yield
        supervisor.stopping.set()
        await background.stop()
        await supervisor.aclose()

    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
            web.get("/v1/aggregators", aggregators),
        ]
    )
    documented(app, operational_document("supervisor", "children per run, restarts"))
    app.cleanup_ctx.append(supervise)
    return app


run = http_service("supervisor", create_app, lambda s: (s.supervisor.host, s.supervisor.port))
