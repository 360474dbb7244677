"""One chaos run: start the system, inject the scheduled faults, drain, check, report.

The phases, in order:

1. start a private Redis (AOF, fsync always), the aggregator and the snapshot service (each
   ready), then the workers, which journal every publish;
2. inject the faults of the seeded schedule, restarting what they took down after its outage
   and whatever exits unasked (as a supervisor would);
3. stop the workers (SIGTERM: a publish in flight completes and is journalled), restore anything
   still down, and wait until the aggregator has drained the stream: every entry delivered and
   acknowledged, with its ledger record;
4. compare the model the snapshot service serves with the committed one, stop the services,
   read the ledger, replay it (`ledger verify`) and count (services/stores/exactly_once.py).

`run_failover` runs a replicated profile three times, durable mode off, on and as shipped, for
the table `fedasync chaos --profile failover` prints (report.py, `failover_table`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos.audit import audit
from fedasync.services.commands.chaos.faults import Injector, wait_until
from fedasync.services.commands.chaos.probe import wait_drained, wait_lag_at_rest, wait_served
from fedasync.services.commands.chaos.report import build_summary, write_summary
from fedasync.services.commands.chaos.schedule import Fault, Profile, build_schedule
from fedasync.services.commands.chaos.system import (
    AGGREGATOR,
    AGGREGATOR_SETTINGS,
    SNAPSHOT,
    System,
)
from fedasync.services.commands.chaos.waits import measure
from fedasync.services.stores.exactly_once import Decided, check
from fedasync.services.worker.journal import read_journals

#: longest the harness waits for the drain and for the snapshot service to catch up, seconds
DRAIN_TIMEOUT_S = 120.0
SERVED_TIMEOUT_S = 30.0
#: for the aggregator's lag gauge to read 0 once drained (it is refreshed about once a second)
LAG_TIMEOUT_S = 30.0
#: how often the fault loop looks for exited children when nothing is scheduled, seconds
TICK_S = 0.1


def run(
    profile: Profile,
    seed: int,
    out: Path,
    say: Callable[[str], None] = print,
    policy: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run the profile once, the aggregator starting with `policy` (fields as their settings
    spell them, e.g. {"mode": "memory"}); returns the summary (also in `out`/summary.json)."""
    out.mkdir(parents=True, exist_ok=True)
    schedule = build_schedule(profile, seed)
    started = time.monotonic()
    with System(out, profile, policy) as system:
        say(f"chaos: starting Redis and services (logs in {out / 'logs'})")
        system.start()
        injector = Injector(system, slow_clients=profile.slow_clients)
        say(f"chaos: {len(schedule)} faults over {profile.window_s:.0f} s")
        _inject(system, injector, schedule, say)

        try:  # a failover's new primary has taken a commit before the workers stop
            injector.wait_recovered()
        except TimeoutError as exc:
            say(f"chaos: {exc}")  # the report shows no first commit after it
        say("chaos: faults over; stopping the workers and draining the stream")
        for name in system.workers:
            if system.supervisor.kill(name, signal.SIGTERM, wait=15.0) is None:
                system.supervisor.kill(name)
        injector.recover(everything=True)
        services = [AGGREGATOR, SNAPSHOT]
        client = system.observer()
        try:
            drained, backlog = wait_drained(
                client,
                system.keys,
                DRAIN_TIMEOUT_S,
                lambda: _supervise(injector, services),
            )
            served = wait_served(
                client,
                system.keys,
                system.snapshot_url,
                SERVED_TIMEOUT_S,
                lambda: _supervise(injector, services),
            )
            lag = wait_lag_at_rest(
                client,
                system.keys,
                f"http://127.0.0.1:{system.aggregator_port}/metrics",
                sorted(system.supervisor.log_dir.glob(f"{AGGREGATOR}*.log")),
                LAG_TIMEOUT_S,
                lambda: _supervise(injector, services),
            )
        finally:
            client.close()
        injector.settle()
        system.supervisor.stop_all(groups=[[SNAPSHOT], [AGGREGATOR]])
        say("chaos: services stopped; auditing the ledger")
        audited = asyncio.run(audit(system.observer_url, system.keys))
        # replicated: what the ACL refused on every server and Sentinel, not the primary only
        acl_refusals = system.group.acl_refusals() if system.group is not None else None
        journals = read_journals(system.journals())
    verdict = check(
        set(journals.acknowledged),
        journals.attempted,
        [Decided.from_record(record) for record in audited.records],
        audited.entry_ids,
        audited.dead_lettered,
    )
    waits = measure(audited.records, AGGREGATOR_SETTINGS.decision_bound_s, injector.interruptions)
    summary = build_summary(
        profile=profile,
        seed=seed,
        out=out,
        duration_s=time.monotonic() - started,
        injector=injector,
        drained=drained,
        backlog=backlog,
        served=served,
        lag=lag,
        audit=audited,
        verdict=verdict,
        waits=waits,
        malformed_journal_lines=journals.malformed,
        acl_refusals=acl_refusals,
        policy=dict(policy or {}),
        acknowledged=journals.acknowledged,
    )
    write_summary(out, summary)
    return summary


#: durable mode in the failover runs: off, on (one of the two replicas must hold each write),
#: and the shipped default (None: nothing set, so on with Sentinels, servers as shipped)
FAILOVER_DURABLE_REPLICAS = 1
FAILOVER_VARIANTS: tuple[int | None, ...] = (0, FAILOVER_DURABLE_REPLICAS, None)


def run_failover(
    profile: Profile,
    seed: int,
    out: Path,
    say: Callable[[str], None] = print,
    policy: Mapping[str, str] | None = None,
    variants: Sequence[int | None] = FAILOVER_VARIANTS,
) -> list[dict[str, Any]]:
    """A replicated profile with durable mode off, on and as shipped (same seed, same
    schedule; `variants` as `FAILOVER_VARIANTS` spells them), each in a folder of its own under
    `out`."""
    runs = []
    for replicas in variants:
        variant = dataclasses.replace(profile, durable_replicas=replicas)
        say(f"chaos: profile {variant.label}")
        name = {None: "shipped-default", 0: "durable-off"}.get(replicas, "durable-on")
        runs.append(run(variant, seed, out / name, say, policy))
    return runs


def _supervise(injector: Injector, names: list[str]) -> None:
    """What a supervisor does between faults: start again what exited, unfreeze a frozen
    snapshot service (replicated profiles)."""
    injector.restart_exited(names)
    injector.watch_snapshot()


def _inject(
    system: System, injector: Injector, schedule: list[Fault], say: Callable[[str], None]
) -> None:
    """The fault phase: each fault at its instant, restarts when due, crashes restarted."""
    names = [AGGREGATOR, SNAPSHOT, *system.workers]
    queue = list(schedule)
    while queue or injector.recovering:
        injector.recover()
        _supervise(injector, names)
        now = injector.now()
        if queue and queue[0].at <= now:
            injector.inject(queue.pop(0))
            event = injector.events[-1]
            say(f"chaos: t={event.at:6.2f} s {event.what}: {event.detail}")
            continue
        upcoming = [t for t in (queue[0].at if queue else None, injector.next_due()) if t]
        wait_until(injector.started + min([now + TICK_S, *upcoming]))
