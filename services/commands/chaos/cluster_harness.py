"""One run of the cluster failover audit: start, kill, drain, check, report.

The phases of chaos/harness.py, for several runs at once on a Redis Cluster: start the cluster
and the runs (chaos/cluster_system.py); kill -9 the scheduled primaries (chaos/cluster_failover.py,
`ClusterInjector`); stop the workers (SIGTERM: a publish in flight completes and is journalled)
and wait until each run's stream is drained, its model served and its lag at rest 0; stop the
services; read and replay each run's ledger (`ledger verify`) and count its updates
(services/stores/exactly_once.py); build the summary and the table (chaos/cluster_report.py).
`run_cluster_failover` runs it with durable mode off, then on, as the CLI does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from fedasync.services.commands.chaos.audit import audit
from fedasync.services.commands.chaos.cluster_failover import (
    TICK_S,
    AtRest,
    ClusterInjector,
    RunResult,
)
from fedasync.services.commands.chaos.cluster_report import build_summary
from fedasync.services.commands.chaos.cluster_system import ClusterRun, ClusterSystem
from fedasync.services.commands.chaos.faults import SETTLED_WITHIN_S, wait_until
from fedasync.services.commands.chaos.probe import wait_drained, wait_lag_at_rest, wait_served
from fedasync.services.commands.chaos.report import write_summary
from fedasync.services.commands.chaos.schedule import FaultKind, Profile, build_schedule
from fedasync.services.commands.chaos.system import AGGREGATOR_SETTINGS, SNAPSHOT
from fedasync.services.commands.chaos.waits import measure
from fedasync.services.stores.exactly_once import Decided, check
from fedasync.services.worker.journal import read_journals
from fedasync.shared.snapshot_protocol import latest_path

#: durable mode in the runs of `fedasync chaos --profile cluster-failover`: off, then on (the
#: cluster's default, WAIT 1), same seed and schedule
CLUSTER_VARIANTS: tuple[int | None, ...] = (0, 1)
#: as chaos/harness.py waits for its one run, for each run
DRAIN_TIMEOUT_S = 120.0
SERVED_TIMEOUT_S = 30.0
LAG_TIMEOUT_S = 30.0
#: how long after the start every run must be training (its first update applied), seconds
FLOWING_WITHIN_S = 120.0
#: how long the workers have to finish a publish in flight when told to stop, seconds
WORKER_STOP_S = 15.0


def run_cluster_failover(
    profile: Profile,
    seed: int,
    out: Path,
    say: Callable[[str], None] = print,
    variants: Sequence[int | None] | None = None,
    policy: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The profile once per durable mode of `variants` (CLUSTER_VARIANTS as the CLI runs it;
    None: the profile's own), each in a folder of its own; their summaries
    (chaos/cluster_report.py)."""
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
        open_at_start = system.cluster.open_to_default()
        _wait_flowing(system, FLOWING_WITHIN_S)
        injector = ClusterInjector(system)  # the schedule's clock starts under load
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
        # every node's ACL LOG (the killed ones' were read before each kill), and whether the
        # nodes, the restarted ones too, still turn away a client that does not log in
        if system.acl:
            injector.read_acl_log()
        open_to_default = sorted({*open_at_start, *system.cluster.open_to_default()})
    summary = build_summary(
        profile=profile,
        seed=seed,
        out=out,
        duration_s=time.monotonic() - started,
        injector=injector,
        results=results,
        open_to_default=open_to_default,
    )
    write_summary(out, summary)
    return summary


def _wait_flowing(system: ClusterSystem, timeout: float) -> None:
    """Until every run has applied an update (a version above genesis): its workers are
    publishing, so no kill lands before the load does (their start takes a while on a busy
    machine). TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    waiting = list(system.runs)
    while waiting:
        for run in list(waiting):
            with contextlib.suppress(redis.RedisError, OSError, RuntimeError):
                port = system.cluster.primary_of(run.tag)
                if int(system.cluster.read(port, run.keys.version) or 0) > 0:
                    waiting.remove(run)
        if time.monotonic() > deadline:
            names = ", ".join(r.id for r in waiting)
            raise TimeoutError(f"no update applied in {names} within {timeout} s of the start")
        time.sleep(TICK_S)


def _drain(system: ClusterSystem, injector: ClusterInjector, run: ClusterRun) -> AtRest:
    """Wait until the run's stream is drained, its model served and its lag at rest 0, reading
    its primary (no kill is due any more: the run's slot stays there)."""
    client = system.observer(system.cluster.primary_of(run.tag))
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
    audited = asyncio.run(audit(system.observer_url, run.keys, system.cluster.addresses))
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
