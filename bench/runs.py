"""Many runs on one Redis Cluster: the figures of docs/operations.md, "Capacity".

`train`: a LocalCluster (services/commands/redis_launch/cluster.py: `--primaries` primaries, a
replica each, no ACL), one snapshot and one ingest service for every run, and the supervisor
(services/supervisor/), which starts one aggregator per run and restarts it when it dies. The
runs are set up as `fedasync up --runs` sets them up (up/many.plan_runs: the first run is the
default run, each run trained from seed + i; up/plan.worker_specs: a fleet of its own per run,
each device signing with a key of its own and publishing through the ingest service). Run ids
are chosen so their slots fall round-robin over the primaries (8 runs on 3: 3/3/2). All train
at once to their budget of applied updates. Mid-training the aggregator of run
`--kill-aggregator` (1-based, its pid from the supervisor's /v1/aggregators) is killed -9: for
every other run, its applied updates per second in the `--window` seconds before and after the
kill (from its ledger: each entry's id is the time its commit ran on the primary), and for the
killed run the time until its restarted aggregator committed again. Then each run's accuracy
(its final model scored on the task's test set, as its evaluator would: no evaluators run, for
the CPU's sake), `ledger verify` (services/stores/ledger.verify, what `fedasync ledger verify`
runs), and the same run trained alone afterwards on the same cluster (same seed and budget,
another id on the same primary, one after the other; `--alone N` for the first N only).

`throughput`: for each `--primaries` count, side by side in one bench run, a fresh LocalCluster
of that many primaries with a replica each (1: one primary and its replica), in durable mode as a
cluster has by default (every commit waits for one replica). Each of `--runs` runs gets a
genesis, then its updates stream is prefilled with `--updates` updates of `--size` float32
parameters (bench/aggregator.py's payloads and prefill), then one aggregator process per run
starts in burst mode, all at once, and each drains its stream and exits. The figure is all
runs' applied updates per second, from the start signal to the last aggregator done; median of
`--repeat` repeats, alternating between the clusters (each flushed between its repeats, its AOFs
rewritten outside the timed part as bench/aggregator.py does), with the spread. Also Redis bytes
per run: MEMORY USAGE (SAMPLES 0) summed over the run's keys once drained. On a machine with few
cores the aggregators are CPU-bound, so the ratio of primaries shows what spreading the runs over
Redis primaries adds there, not a ceiling.

Run: python bench/runs.py train [--primaries 3] [--runs 8] [--task digits] [--budget 300]
       [--devices 2] [--kill-aggregator 3] [--window 10] [--seed 1] [--alone N] [--json PATH]
     python bench/runs.py throughput [--primaries 1 3] [--runs 6] [--size 100000]
       [--updates 400] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis

# bench/ is this script's directory, first on sys.path: the same updates and the same prefill as
# the aggregator bench, and the commit line of the ingest bench
from aggregator import fill, payloads
from machine import machine

from fedasync.learning.tasks import task_data
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.cluster import LocalCluster, process_state
from fedasync.services.commands.up.many import OneRun, plan_runs, provision_devices
from fedasync.services.commands.up.plan import HOST, Ports, configure, worker_specs
from fedasync.services.runtime.ports import free_port
from fedasync.services.runtime.redis_cluster import node_of
from fedasync.services.runtime.redis_conn import connect, get_bytes
from fedasync.services.runtime.run_settings import settings_for_run
from fedasync.services.runtime.settings import Settings, load_settings, settings_env
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor
from fedasync.services.stores import ledger
from fedasync.services.stores.runs import create_run
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.keys import Keys
from fedasync.shared.layout import Layout
from fedasync.shared.model_format import decode_model
from fedasync.shared.runs import RunSpec, TaskSpec
from fedasync.shared.seeds import Stream, stream

ROOT = Path(__file__).resolve().parents[1]
#: how often the train phase looks at the runs, seconds
POLL_S = 0.25
#: how long any one thing may take to start or end on a loaded machine, seconds
PATIENCE_S = 300.0
#: the killed run's applied updates (a share of its budget) before the kill -9
KILL_AT = 0.35


# ------------------------------------------------------------------------------ run ids
def spread_ids(cluster: LocalCluster, count: int, stem: str) -> list[str]:
    """`count` run ids whose slots fall round-robin over the cluster's primaries (by port): run
    i on primary i mod P, so 8 runs on 3 primaries fall 3/3/2."""
    primaries = sorted(cluster.primaries())
    pools: dict[int, list[str]] = {port: [] for port in primaries}
    n = 0
    out = []
    for i in range(count):
        target = primaries[i % len(primaries)]
        while not pools[target]:
            n += 1
            candidate = f"{stem}{n}"
            pools[cluster.primary_of("{" + candidate + "}")].append(candidate)
        out.append(pools[target].pop(0))
    return out


def same_primary_id(cluster: LocalCluster, run: str, suffix: str) -> str:
    """An id of the form `<run>-<suffix><n>` on the same primary as `run`."""
    home = cluster.primary_of("{" + run + "}")
    for n in range(1, 1000):
        candidate = f"{run}-{suffix}{n}"
        if cluster.primary_of("{" + candidate + "}") == home:
            return candidate
    raise RuntimeError(f"no id beside {run} on 127.0.0.1:{home}")


def slot_of(run: str) -> int:
    return int(redis.crc.key_slot(("{" + run + "}").encode()))


# ------------------------------------------------------------------------------ train
@dataclass
class Trained:
    """What one run ended with."""

    run: str
    slot: int
    primary: int
    applied: int = 0
    version: int = 0
    accuracy: float | None = None
    verify: str = "-"
    alone_run: str | None = None
    alone_accuracy: float | None = None
    alone_applied: int | None = None
    commits_ms: list[int] = field(default_factory=list)


def commit_ms(record: dict[str, Any]) -> int:
    """When the commit that wrote a ledger record ran: its entry id's time part, the primary's
    clock (this machine's), ms."""
    return int(str(record["ledger_id"]).split("-")[0])


def accuracy_of(settings: Settings, weights: np.ndarray) -> float:
    """The model's score on the run's test split, as the run's evaluator computes it."""
    task = settings.task.build()
    _, test = task_data(settings.task.name, task, stream(settings.task.seed, Stream.DATA))
    return float(task.evaluate(weights, test).score)


async def final_state(settings: Settings) -> tuple[int, int, list[int], float | None, str]:
    """(applied, version, the ms of each applied update's commit, accuracy, verify verdict)."""
    client = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        commits = [
            commit_ms(r) async for r in ledger.records(client, keys) if r["outcome"] == "applied"
        ]
        version = int(await client.get(keys.version) or 0)
        raw = await get_bytes(client, keys.model(version))
        accuracy = None
        if raw is not None:
            weights = np.asarray(decode_model(raw, max_bytes=len(raw)).snapshot.weights)
            accuracy = await asyncio.to_thread(accuracy_of, settings, weights)
        report = await ledger.verify(client, keys, settings.wire.max_message_bytes)
        verdict = f"OK ({report.replayed})" if report.ok else "FAILED"
    finally:
        await client.aclose()
    return len(commits), version, commits, accuracy, verdict


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5.0) as response:
        return json.loads(response.read())


class Deployment:
    """The cluster's shared services, the supervisor, and each run's devices (module docstring)."""

    def __init__(self, base: Settings, ports: Ports, supervisor_port: int, work: Path) -> None:
        self.base = base
        self.ports = ports
        self.supervisor_url = f"http://{HOST}:{supervisor_port}"
        self.procs = Supervisor(work / "logs")
        self.redis = connect(base.redis)

    def start(self) -> None:
        env = settings_env(self.base)
        self.procs.start(
            ServiceSpec(
                "supervisor", "fedasync.services.supervisor", env, self.supervisor_url + "/readyz"
            )
        )
        self.procs.wait_ready("supervisor", PATIENCE_S)

    def start_shared(self) -> None:
        """snapshot and ingest (ready once the default run's genesis is committed)."""
        env = settings_env(self.base)
        for name in ("snapshot", "ingest"):
            ready = self.ports.url(name) + "/readyz"
            self.procs.start(ServiceSpec(name, f"fedasync.services.{name}", env, ready))
        for name in ("snapshot", "ingest"):
            self.procs.wait_ready(name, PATIENCE_S)

    def aggregator_of(self, run: str) -> dict[str, Any] | None:
        entry = get_json(self.supervisor_url + "/v1/aggregators")["runs"].get(run) or {}
        child: dict[str, Any] | None = entry.get("children", {}).get("aggregator")
        return child

    async def until(self, what: str, check: Any) -> Any:
        deadline = time.monotonic() + PATIENCE_S
        while True:
            crashed = [c.spec.name for c in self.procs.crashed()]
            if crashed:
                raise RuntimeError(f"{what}: {crashed} exited; logs in {self.procs.log_dir}")
            found = await check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {PATIENCE_S:.0f} s: {what}")
            await asyncio.sleep(POLL_S)

    async def genesis(self, runs: list[OneRun]) -> None:
        async def all_committed() -> bool:
            return all([await self.redis.exists(r.keys.version) for r in runs])

        await self.until("every run's genesis", all_committed)

    async def devices(self, run: OneRun) -> list[str]:
        keys = await provision_devices(run.settings)
        names = []
        for spec in worker_specs(run.settings, self.ports, keys):
            name = f"{run.id}.{spec.name}"
            self.procs.start(ServiceSpec(name, spec.module, spec.env))
            names.append(name)
        return names

    def stop(self, names: list[str]) -> None:
        for name in names:
            self.procs.kill(name, signal.SIGTERM, wait=30)

    async def done(self, run: OneRun) -> bool:
        return bool(await self.redis.exists(run.keys.done))

    async def aclose(self) -> None:
        await self.redis.aclose()
        self.procs.stop_all(groups=[[n for n in self.procs.children if ".worker-" in n]])


async def kill_phase(
    dep: Deployment, runs: list[OneRun], victim: OneRun, budget: int, window: float
) -> dict[str, Any]:
    """Wait until mid-training, kill -9 the victim's aggregator, and time what follows."""
    first: dict[str, float] = {}

    async def ready_to_kill() -> bool:
        for run in runs:
            if run.id not in first:
                async for record in ledger.records(dep.redis, run.keys, page=1):
                    first[run.id] = commit_ms(record) / 1000
                    break
        if len(first) < len(runs) or time.time() - max(first.values()) < window:
            return False
        length = await dep.redis.xlen(victim.keys.ledger)
        return bool(length >= KILL_AT * budget)

    await dep.until("mid-training", ready_to_kill)
    if await dep.done(victim):
        raise RuntimeError(f"{victim.id} ended before its kill: give a larger --budget")
    child = dep.aggregator_of(victim.id)
    if child is None or not child["running"]:
        raise RuntimeError(f"{victim.id} has no running aggregator to kill: {child}")
    pid = int(child["pid"])
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()

    async def dead() -> bool:  # the supervisor's child: a zombie until the supervisor reaps it
        try:
            return process_state(pid) in ("Z", "X")
        except (OSError, IndexError):
            return True

    await dep.until(f"pid {pid} gone", dead)
    tail = await ledger.last_record(dep.redis, victim.keys)
    last = "0-0" if tail is None else str(tail["ledger_id"])

    async def restarted() -> dict[str, Any] | None:
        now = dep.aggregator_of(victim.id)
        return now if now and now["running"] and now["pid"] != pid else None

    second = await dep.until(f"{victim.id}'s aggregator restarted", restarted)
    restart_seen = time.time()

    async def next_commit() -> int | None:
        async for record in ledger.records(dep.redis, victim.keys, after=last, page=1):
            return commit_ms(record)
        return None

    committed_ms = await dep.until(f"{victim.id}'s next commit", next_commit)
    await dep.until("the window after the kill", lambda: _past(killed_at + window))
    return {
        "run": victim.id,
        "pid": pid,
        "pid_after": second["pid"],
        "restarts": second["restarts"],
        "last_exit": second["last_exit"],
        "killed_at": killed_at,
        "restart_seen_s": restart_seen - killed_at,
        "next_commit_s": committed_ms / 1000 - killed_at,
        "window_s": window,
    }


async def _past(moment: float) -> bool:
    return time.time() >= moment


def rates(commits_ms: list[int], at: float, window: float) -> tuple[float, float]:
    """Applied updates per second in the `window` before `at` and in the one after."""
    before = sum(1 for ms in commits_ms if at - window <= ms / 1000 < at)
    after = sum(1 for ms in commits_ms if at <= ms / 1000 < at + window)
    return before / window, after / window


async def train_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    cluster = LocalCluster(work / "cluster", primaries=args.primaries)
    cluster.start()
    started = time.monotonic()
    try:
        ids = spread_ids(cluster, args.runs, "r")
        ports = Ports.free()
        supervisor_port = free_port()
        budget = {"max_updates": args.budget, "max_seconds": 86_400.0}
        raw = load_settings(
            redis=cluster.redis_settings(key_prefix=ids[0], socket_timeout_s=10.0),
            task={"name": args.task, "seed": args.seed, "num_devices": args.devices},
            budget=budget,
            supervisor={
                "host": HOST,
                "port": supervisor_port,
                "poll_s": 0.5,
                "done_grace_s": 2.0,
                "evaluators": False,
                "log_dir": str(work / "logs" / "children"),
            },
            log={"level": "WARNING"},
        )
        base = configure(raw, cluster.url, ids[0], ports, secure=True)
        specs = [
            RunSpec(
                run,
                TaskSpec(args.task, {}, args.seed + i, args.devices),
                {},
                budget,
                created_at=time.time(),
                created_by="bench/runs.py",
            )
            for i, run in enumerate(ids)
        ]
        runs = plan_runs(base, len(specs), specs)
        victim = runs[args.kill_aggregator - 1]
        dep = Deployment(base, ports, supervisor_port, work)
        try:
            for spec in specs[1:]:  # the first is the default run, which needs no spec
                await create_run(dep.redis, spec)
            dep.start()
            await dep.genesis(runs)
            dep.start_shared()
            workers = {run.id: await dep.devices(run) for run in runs}
            train_started = time.monotonic()
            kill = await kill_phase(dep, runs, victim, args.budget, args.window)
            pending = list(runs)
            while pending:
                for run in [r for r in pending if await dep.done(r)]:
                    dep.stop(workers.pop(run.id))
                    pending.remove(run)
                await asyncio.sleep(POLL_S)
            train_s = time.monotonic() - train_started
            dep.stop([n for names in workers.values() for n in names])
            results = []
            for run in runs:
                applied, version, commits, accuracy, verdict = await final_state(run.settings)
                home = cluster.primary_of("{" + run.id + "}")
                row = Trained(run.id, slot_of(run.id), home, applied, version, accuracy, verdict)
                row.commits_ms = commits
                results.append(row)
            alone = runs if args.alone is None else runs[: args.alone]
            alone_started = time.monotonic()
            for i, run in enumerate(alone):
                row = results[runs.index(run)]
                row.alone_run, row.alone_applied, row.alone_accuracy = await train_alone(
                    dep, cluster, base, specs[runs.index(run)], i
                )
            alone_s = time.monotonic() - alone_started
        finally:
            await dep.aclose()
    finally:
        cluster.stop()
    return {
        "primaries": args.primaries,
        "runs": args.runs,
        "task": args.task,
        "budget": args.budget,
        "devices": args.devices,
        "seed": args.seed,
        "train_s": train_s,
        "alone_s": alone_s,
        "alone_runs": len(alone),
        "wall_s": time.monotonic() - started,
        "kill": kill,
        "results": results,
    }


async def train_alone(
    dep: Deployment, cluster: LocalCluster, base: Settings, spec: RunSpec, index: int
) -> tuple[str, int, float | None]:
    """`spec` again under another id on the same primary, by itself; (id, applied, accuracy)."""
    again = RunSpec(
        same_primary_id(cluster, spec.id, "alone"),
        spec.task,
        spec.policy,
        spec.budget,
        created_at=time.time(),
        created_by="bench/runs.py",
    )
    run = OneRun(again.id, settings_for_run(base, again), default=False)
    await create_run(dep.redis, again)
    await dep.genesis([run])
    names = await dep.devices(run)
    await dep.until(f"{run.id} done", lambda: dep.done(run))
    dep.stop(names)
    applied, _, _, accuracy, _ = await final_state(run.settings)
    return run.id, applied, accuracy


def train_report(doc: dict[str, Any]) -> None:
    results: list[Trained] = doc["results"]
    kill = doc["kill"]
    print(
        f"\n{doc['runs']} runs at once on {doc['primaries']} primaries (a replica each), task "
        f"{doc['task']}, {doc['devices']} devices per run, budget {doc['budget']} applied "
        f"updates; trained in {doc['train_s']:.0f} s; the alone column: {doc['alone_runs']} of "
        f"{doc['runs']} runs, one after another, in {doc['alone_s']:.0f} s"
    )
    print("| run | slot | primary port | updates | version | accuracy | alone | Δ | verify |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        delta = (
            f"{r.accuracy - r.alone_accuracy:+.3f}"
            if r.accuracy is not None and r.alone_accuracy is not None
            else "-"
        )
        print(
            f"| {r.run} | {r.slot} | {r.primary} | {r.applied} | {r.version} | "
            f"{_num(r.accuracy)} | {_num(r.alone_accuracy)} | {delta} | {r.verify} |"
        )
    window = kill["window_s"]
    print(
        f"\nkill -9 of {kill['run']}'s aggregator (pid {kill['pid']}, exit {kill['last_exit']}): "
        f"the supervisor restarted it (pid {kill['pid_after']}, restarts {kill['restarts']}), "
        f"seen {kill['restart_seen_s']:.1f} s after the kill; its next commit "
        f"{kill['next_commit_s']:.1f} s after the kill"
    )
    columns = f"updates/s, {window:g} s before | {window:g} s after | after/before"
    print(f"| run | primary port | {columns} |")
    print("|---|---|---|---|---|")
    for r in results:
        if r.run == kill["run"]:
            continue
        before, after = rates(r.commits_ms, kill["killed_at"], window)
        ratio = f"{after / before:.2f}" if before else "-"
        ended = r.commits_ms and r.commits_ms[-1] / 1000 < kill["killed_at"] + window
        note = " (budget reached in the window)" if ended else ""
        print(f"| {r.run} | {r.primary} | {before:.1f} | {after:.1f} | {ratio}{note} |")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def train_json(doc: dict[str, Any]) -> dict[str, Any]:
    kill = doc["kill"]
    rows = []
    for r in doc["results"]:
        before, after = rates(r.commits_ms, kill["killed_at"], kill["window_s"])
        rows.append(
            {
                "run": r.run,
                "slot": r.slot,
                "primary": r.primary,
                "updates": r.applied,
                "version": r.version,
                "accuracy": r.accuracy,
                "alone_run": r.alone_run,
                "alone_updates": r.alone_applied,
                "alone_accuracy": r.alone_accuracy,
                "verify": r.verify,
                "rate_before": before,
                "rate_after": after,
            }
        )
    return {**{k: v for k, v in doc.items() if k != "results"}, "results": rows}


# ------------------------------------------------------------------------------ throughput
@contextmanager
def nodes_of(cluster: LocalCluster) -> Iterator[list[redis.Redis]]:
    clients = [redis.Redis(port=node.port, socket_timeout=120) for node in cluster.nodes]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def settle_aofs(cluster: LocalCluster) -> None:
    """Every node's AOF rewritten now, and waited for (bench/aggregator.py's settle_aof, on each
    node): no rewrite forks a node during a timed part."""
    with nodes_of(cluster) as clients:
        for client in clients:
            client.bgrewriteaof()
        for client in clients:
            while True:
                info: Any = client.info("persistence")
                if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                    break
                time.sleep(0.05)


def run_settings(cluster: LocalCluster, run: str, size: int) -> Settings:
    return load_settings(
        redis=cluster.redis_settings(key_prefix=run, socket_timeout_s=120.0),
        aggregator={"read_count": max(1, min(32, (256 << 20) // (4 * size)))},
        budget={"max_updates": 10**9, "max_seconds": 10**9},
        log={"level": "WARNING"},
    )


async def prepare(settings: Settings, size: int, raw: list[bytes]) -> None:
    """A genesis of `size` zeros, then the stream prefilled."""
    client = connect(settings.redis)
    try:
        initial = AggregationState(np.zeros(size, np.float32), Layout.flat(size))
        await run_aggregator(
            settings, redis=client, initial=initial, handle_signals=False, burst=True
        )
        await fill(client, Keys(settings.redis.key_prefix).updates, raw)
    finally:
        await client.aclose()


async def after_drain(settings: Settings) -> tuple[int, int, int]:
    """(applied, decided, Redis bytes of the run's keys) once its stream is drained."""
    client = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        outcomes = [r["outcome"] async for r in ledger.records(client, keys)]
        await client.initialize()  # the slot map, for node_of
        pattern = f"{{{keys.prefix}}}:*"  # a run's keys, all on its slot's primary
        names = [
            name
            async for name in client.scan_iter(
                match=pattern, count=1000, target_nodes=node_of(client, keys.state)
            )
        ]
        total = 0
        for name in names:
            total += int(await client.memory_usage(name, samples=0) or 0)
    finally:
        await client.aclose()
    return outcomes.count("applied"), len(outcomes), total


def burst_children(settings: list[Settings]) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "burst"],
            cwd=ROOT,
            env={**os.environ, **settings_env(s)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for s in settings
    ]


def one_repeat(
    cluster: LocalCluster, ids: list[str], size: int, raw: list[bytes]
) -> dict[str, Any]:
    """Flush, genesis and prefill every run, then all aggregators at once; the figures."""
    with nodes_of(cluster) as clients:
        for client in clients:
            if client.info("replication")["role"] == "master":
                client.flushall()
    cluster.wait_settled()
    settle_aofs(cluster)
    settings = [run_settings(cluster, run, size) for run in ids]
    for s in settings:
        asyncio.run(prepare(s, size, raw))
    cluster.wait_settled(PATIENCE_S)  # the replicas hold the prefill before anything is timed
    children = burst_children(settings)
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("an aggregator did not start (its stderr above)")
        go = time.time()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        ends = []
        for child in children:
            out, _ = child.communicate(timeout=PATIENCE_S)
            if child.returncode != 0:
                raise RuntimeError(f"an aggregator exited {child.returncode}")
            ends.append(json.loads(out.strip().splitlines()[-1])["ended"])
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    seconds = max(ends) - go
    drained = [asyncio.run(after_drain(s)) for s in settings]
    applied = sum(d[0] for d in drained)
    return {
        "seconds": seconds,
        "applied": applied,
        "decided": sum(d[1] for d in drained),
        "updates_per_s": applied / seconds,
        "bytes_per_run": statistics.median(d[2] for d in drained),
    }


def throughput(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    raw = payloads(args.size, args.updates)
    out: dict[str, Any] = {
        "runs": args.runs,
        "size": args.size,
        "updates_per_run": args.updates,
        "repeat": args.repeat,
        "rows": [],
    }
    clusters = [LocalCluster(work / f"cluster-{p}", primaries=p) for p in args.primaries]
    repeats: list[list[dict[str, Any]]] = [[] for _ in clusters]
    try:
        for cluster in clusters:
            cluster.start()
            with nodes_of(cluster) as clients:  # rewrites only between repeats (settle_aofs)
                for client in clients:
                    client.config_set("auto-aof-rewrite-percentage", 0)
        ids = [spread_ids(c, args.runs, f"t{c.primary_count}-") for c in clusters]
        # the repeats alternate between the clusters, so a load that comes and goes on a shared
        # machine touches each alike
        for i in range(args.repeat):
            for k, cluster in enumerate(clusters):
                repeats[k].append(one_repeat(cluster, ids[k], args.size, raw))
                rate = repeats[k][-1]["updates_per_s"]
                print(f"  repeat {i + 1}, {cluster.primary_count} primaries: {rate:.1f} updates/s")
        durability = run_settings(clusters[0], ids[0][0], args.size).redis.durability
    finally:
        for cluster in clusters:
            cluster.stop()
    for primaries, done in zip(args.primaries, repeats, strict=True):
        rate = statistics.median(r["updates_per_s"] for r in done)
        out["rows"].append(
            {
                "primaries": primaries,
                "replicas_per_primary": 1,
                "durable_replicas": durability.replicas,
                "updates_per_s": rate,
                "per_run": rate / args.runs,
                "per_primary": rate / primaries,
                "rates": sorted(r["updates_per_s"] for r in done),
                "applied": [r["applied"] for r in done],
                "decided": [r["decided"] for r in done],
                "bytes_per_run": statistics.median(r["bytes_per_run"] for r in done),
            }
        )
    return out


def throughput_report(doc: dict[str, Any]) -> None:
    rows = doc["rows"]
    first = rows[0]["updates_per_s"]
    print(
        f"\n{doc['runs']} runs, {doc['updates_per_run']} prefilled updates each of "
        f"{doc['size']} float32 parameters; one aggregator process per run, all at once, burst "
        f"mode; each cluster a replica per primary, durable mode on (WAIT "
        f"{rows[0]['durable_replicas']} replica per commit, the cluster default); median of "
        f"{doc['repeat']} repeats"
    )
    print(
        f"on {os.cpu_count()} cores the {doc['runs']} aggregators are CPU-bound: the ratio shows "
        "what spreading the runs over Redis primaries adds here, not the machine's ceiling"
    )
    label = f"ratio vs {rows[0]['primaries']}"
    print(
        f"| primaries | total updates/s | per run | per primary | Redis bytes per run | {label} "
        "| spread (updates/s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        spread = ", ".join(f"{x:.1f}" for x in row["rates"])
        print(
            f"| {row['primaries']} | {row['updates_per_s']:.1f} | {row['per_run']:.1f} | "
            f"{row['per_primary']:.1f} | {row['bytes_per_run'] / 1e6:.1f} MB | "
            f"{row['updates_per_s'] / first:.2f} | {spread} |"
        )


# ------------------------------------------------------------------------------ burst child
async def burst_async() -> None:
    """One aggregator in burst mode, on the go of the parent: the settings from the
    environment; prints the time it was done."""
    settings = load_settings()
    client = connect(settings.redis)
    try:
        await client.ping()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        started = time.time()
        result = await run_aggregator(settings, redis=client, handle_signals=False, burst=True)
        print(json.dumps({"started": started, "ended": time.time(), "version": result.version}))
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="runs training at once; a kill -9 mid-training")
    train.add_argument("--primaries", type=int, default=3)
    train.add_argument("--runs", type=int, default=8)
    train.add_argument("--task", default="digits")
    train.add_argument("--budget", type=int, default=300, help="applied updates per run")
    train.add_argument("--devices", type=int, default=2, help="devices (workers) per run")
    train.add_argument("--kill-aggregator", type=int, default=3, help="1-based run index")
    train.add_argument("--window", type=float, default=10.0, help="seconds before/after kill")
    train.add_argument("--seed", type=int, default=1)
    train.add_argument(
        "--alone", type=int, default=None, help="train only the first N runs alone (default all)"
    )
    train.add_argument("--json", type=Path, help="also write the figures here")
    train.add_argument("--keep", action="store_true", help="keep the Redis data and logs")
    through = commands.add_parser("throughput", help="updates/s against primaries")
    through.add_argument("--primaries", type=int, nargs="+", default=[1, 3])
    through.add_argument("--runs", type=int, default=6)
    through.add_argument("--size", type=int, default=100_000, help="float32 parameters")
    through.add_argument("--updates", type=int, default=400, help="prefilled updates per run")
    through.add_argument("--repeat", type=int, default=3)
    through.add_argument("--json", type=Path, help="also write the figures here")
    through.add_argument("--keep", action="store_true", help="keep the Redis data and logs")
    commands.add_parser("burst")  # the aggregator child of `throughput`
    args = parser.parse_args()
    if args.command == "burst":
        asyncio.run(burst_async())
        return 0
    if args.command == "train" and not 1 <= args.kill_aggregator <= args.runs:
        parser.error("--kill-aggregator names a run by its place, 1 to --runs")
    print(machine(), flush=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="fedasync-runs-"))
    ok = False
    try:
        if args.command == "train":
            doc = asyncio.run(train_async(args, work))
            train_report(doc)
            written = train_json(doc)
        else:
            written = throughput(args, work)
            throughput_report(written)
        ok = True
    finally:
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"Redis data and logs kept in {work}", file=sys.stderr)
    wall = time.monotonic() - started
    written["wall_s"] = wall
    written["nproc"] = os.cpu_count()
    written["load_average_end"] = list(os.getloadavg())
    print(f"\nwall {wall:.0f} s; {machine()}")
    if args.json is not None:
        args.json.write_text(json.dumps(written, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
