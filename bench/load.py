"""Load: a fleet of simulated devices against the real services, with an update-rate spike.

A private redis-server (AOF, appendfsync always) and the aggregator, snapshot and control services
run as child processes (services/runtime/supervisor.py), configured only through FEDASYNC_
variables as in production. One asyncio process plays every device over HTTP and Redis, as a real
device does:

- **rest**: between two trainings a device follows the model with long-polls
  (`GET /v1/models/latest?newer_than=<its version>&wait=…`), as the evaluator does; each commit
  wakes every device resting, which is the fan-out the snapshot service has to absorb;
- **check**: just before training, a conditional GET (`If-None-Match: <its ETag>`), as the worker
  does: a 304 when following kept it current, a 200 and a download otherwise;
- **train**: a seeded random sleep (no torch: the benchmark measures the system, not SGD);
- **publish**: XADD of an encoded update (shared/wire.py), recorded with its entry id once Redis
  answered, so that every acknowledged update can be looked for in the ledger at the end.

Publish times are a Poisson process whose rate is the normal rate through a warm-up (not
measured: it holds the start, when every device downloads the model at once, and lets the rule's
window fill) and the first third of the measured `--seconds`, `--rate-factor` times that in the
middle third (the spike), and normal again in the last third. Each device draws
its arrivals from its own seeded generator, by inverting the integrated rate, so a device resting
when the spike starts speeds up at once, exactly as a memoryless fleet would.

The control service's update-rate rule gets thresholds between the two rates (on above the middle
of normal and spike, off below the middle of normal and that), with a short window and hold, so
`raise-gamma` should turn on during the spike and off after it: when it did is read from the
policy log, which the rule writes through the same audited path as an operator.

Figures per phase: fetch latency percentiles of 200s and 304s (request to last byte), the
long-poll wake-up delay (the version's `created_at`, stamped by the aggregator as it seals the
commit, to the device holding the body: commit with fsync, pub/sub, the snapshot's refresh and
the response), fetches, bytes and updates per second, the client's event-loop lag (when it is
large, the client, not the services, limits the figures) and CPU per process. At the end,
nothing lost: every acknowledged update has exactly one decision in the ledger, which names its
entry, nothing is pending, and `ledger verify` replays the ledger to the committed model.

Everything shares this machine's cores (devices, services, Redis), so the figures describe a
small deployment on one host, not any part alone.

Devices share one connection pool (aiohttp's, keep-alive): a device's requests reuse an open
connection, as a device's client does, so the services see the fleet's connections, not one per
request. The snapshot service runs `--snapshot-workers` processes (FEDASYNC_SNAPSHOT__WORKERS);
its CPU figure is theirs together. The devices' process runs on uvloop, as the snapshot service.

Run: python bench/load.py [--devices 200] [--seconds 30] [--rate-factor 4] [--rate 10]
                          [--snapshot-workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import redis.asyncio as aioredis
from machine import process_cpu

from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect, stream_entries
from fedasync.services.runtime.settings import Settings, load_settings, settings_env
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor
from fedasync.services.snapshot.__main__ import new_event_loop
from fedasync.services.stores.exactly_once import Decided, check
from fedasync.services.stores.ledger import records, verify
from fedasync.services.stores.policy_store import policy_log as read_policy_log
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("warm-up", "before", "spike", "after")
SERVICES = ("aggregator", "snapshot", "control")
HOST = "127.0.0.1"
#: the rule's window and hold, short enough to act within a 10 s spike
WINDOW_S = 4.0
HOLD_S = 1.5
#: share of the time between two publishes a device spends training (the rest it follows)
TRAIN_SHARE = (0.6, 0.9)
#: how often the control service's status is sampled, seconds
STATUS_EVERY_S = 0.5
#: how often the client's event loop is probed for lag, seconds
LAG_PROBE_S = 0.05
#: XADDs in flight at once from the devices' process: below redis-py's pool of 100 connections
#: (shared with the audit's reads), which refuses more at once instead of queueing them
PUBLISHING = asyncio.Semaphore(64)


@dataclass(frozen=True, slots=True)
class Plan:
    """The run's shape: fleet, phases and rates; everything random derives from `seed`."""

    devices: int
    seconds: float
    rate: float  # normal updates per second, whole fleet
    rate_factor: float
    seed: int
    task: str
    wait_s: float  # longest long-poll
    warmup: float  # seconds at the normal rate before anything is measured
    snapshot_workers: int = 1  # FEDASYNC_SNAPSHOT__WORKERS

    @property
    def end(self) -> float:
        """End of the load, seconds from its start (warm-up included)."""
        return self.warmup + self.seconds

    @property
    def bounds(self) -> tuple[float, float]:
        """Start and end of the spike, seconds from the start of the load."""
        return self.warmup + self.seconds / 3, self.warmup + 2 * self.seconds / 3

    @property
    def rate_high(self) -> float:
        return self.rate * (1 + self.rate_factor) / 2

    @property
    def rate_low(self) -> float:
        return (self.rate + self.rate_high) / 2

    def phase_of(self, t: float) -> str:
        start, end = self.bounds
        if t < self.warmup:
            return "warm-up"
        return "before" if t < start else "spike" if t < end else "after"

    def phase_seconds(self, phase: str) -> float:
        start, end = self.bounds
        return {
            "warm-up": self.warmup,
            "before": start - self.warmup,
            "spike": end - start,
            "after": self.end - end,
        }[phase]

    def segments(self) -> Iterator[tuple[float, float, float]]:
        """(start, end, updates per second per device) of the piecewise-constant rate."""
        start, end = self.bounds
        per_device = self.rate / self.devices
        yield 0.0, start, per_device
        yield start, end, per_device * self.rate_factor
        yield end, math.inf, per_device

    def next_publish(self, now: float, exp1: float) -> float:
        """The next arrival after `now` of the device's Poisson process, given an Exp(1) draw:
        the time at which the integrated rate since `now` reaches it."""
        left = exp1
        for start, end, rate in self.segments():
            if end <= now:
                continue
            lo = max(now, start)
            if lo + left / rate <= end:
                return lo + left / rate
            left -= (end - lo) * rate
        raise AssertionError("the last segment is unbounded")


# ------------------------------------------------------------------------------- recording
@dataclass(slots=True)
class PhaseFigures:
    """What the devices saw in one phase (lists of seconds; percentiles are taken at the end)."""

    full: list[float] = field(default_factory=list)  # 200 without waiting: request to body
    not_modified: list[float] = field(default_factory=list)  # 304: request to headers
    wake: list[float] = field(default_factory=list)  # long-poll woken: created_at to body
    timeouts: int = 0  # long-polls that ended with 204
    errors: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    published: int = 0
    loop_lag: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Recorder:
    plan: Plan
    t0: float  # wall clock (time.time()) at the start of the load
    phases: dict[str, PhaseFigures] = field(
        default_factory=lambda: {p: PhaseFigures() for p in PHASES}
    )
    #: update id → (entry id, seconds since t0) for every XADD Redis acknowledged
    published: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: update ids whose XADD failed: Redis may or may not have added them
    uncertain: set[str] = field(default_factory=set)
    status: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return time.time() - self.t0

    def at(self, t: float) -> PhaseFigures:
        return self.phases[self.plan.phase_of(t)]


# --------------------------------------------------------------------------------- devices
@dataclass(slots=True)
class Held:
    """The model a device holds."""

    version: int = -1
    etag: str | None = None
    weights: np.ndarray | None = None


class Device:
    """One simulated device: rest (follow), check, train, publish, until the run ends."""

    def __init__(
        self,
        index: int,
        plan: Plan,
        rec: Recorder,
        session: aiohttp.ClientSession,
        redis: aioredis.Redis,
        keys: Keys,
        snapshot_url: str,
    ) -> None:
        self.index = index
        self.plan = plan
        self.rec = rec
        self.session = session
        self.redis = redis
        self.keys = keys
        self.url = snapshot_url + "/v1/models/latest"
        self.rng = np.random.default_rng([plan.seed, index])
        self.held = Held()
        self.client_id = f"device-{index:04d}"
        self.runs = 0

    async def live(self, publishes: set[asyncio.Task[None]]) -> None:
        await self.check()
        while True:
            now = self.rec.now()
            slot = self.plan.next_publish(now, float(self.rng.exponential()))
            train = float(self.rng.uniform(*TRAIN_SHARE)) * (slot - now)
            await self.follow(min(slot - train, self.plan.end))
            if slot >= self.plan.end:
                return
            await self.check()
            await asyncio.sleep(max(slot - self.rec.now(), 0.0))  # training
            # shielded: a publish Redis may already hold is always recorded, even at shutdown
            task = asyncio.create_task(self.publish())
            publishes.add(task)
            task.add_done_callback(publishes.discard)
            await asyncio.shield(task)

    async def check(self) -> None:
        """Conditional GET: 304 if the held version is the newest, else download it."""
        headers = {"If-None-Match": self.held.etag} if self.held.etag else {}
        sent = time.perf_counter()
        try:
            async with self.session.get(self.url, headers=headers) as response:
                if response.status == 304:
                    self.rec.at(self.rec.now()).not_modified.append(time.perf_counter() - sent)
                    return
                if response.status != 200:
                    self._error(f"check {response.status}")
                    return
                body = await response.read()
                elapsed = time.perf_counter() - sent
                etag = response.headers.get("ETag")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._error(f"check {type(exc).__name__}")
            return
        figures = self.rec.at(self.rec.now())
        figures.full.append(elapsed)
        figures.bytes += len(body)
        self._hold(body, etag)

    async def follow(self, until: float) -> None:
        """Long-poll for versions newer than the held one until `until` (run seconds)."""
        while (left := until - self.rec.now()) > 0.05:
            wait = min(left, self.plan.wait_s)
            params = {"newer_than": str(self.held.version), "wait": f"{wait:.3f}"}
            sent_wall, sent = time.time(), time.perf_counter()
            try:
                async with self.session.get(self.url, params=params) as response:
                    if response.status == 204:
                        self.rec.at(self.rec.now()).timeouts += 1
                        continue
                    if response.status != 200:
                        self._error(f"long-poll {response.status}")
                        await asyncio.sleep(0.2)
                        continue
                    body = await response.read()
                    received_wall, elapsed = time.time(), time.perf_counter() - sent
                    etag = response.headers.get("ETag")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._error(f"long-poll {type(exc).__name__}")
                await asyncio.sleep(0.2)
                continue
            created = self._hold(body, etag)
            figures = self.rec.at(received_wall - self.rec.t0)
            figures.bytes += len(body)
            if created > sent_wall:  # committed while the request waited: it was woken
                figures.wake.append(received_wall - created)
            else:  # a newer version was already there: an ordinary download
                figures.full.append(elapsed)

    def _hold(self, body: bytes, etag: str | None) -> float:
        """Keep a downloaded model; its commit time."""
        message = decode_model(body, max_bytes=len(body))
        if message.snapshot.version >= self.held.version:
            self.held = Held(message.snapshot.version, etag, message.snapshot.weights)
        return message.created_at

    async def publish(self) -> None:
        """XADD an update trained from the held version (its weights plus seeded noise)."""
        if self.held.weights is None:  # every download so far failed: nothing to train on
            self._error("publish without a model")
            return
        weights = self.held.weights + self.rng.normal(0.0, 0.01, self.held.weights.shape)
        update_id = f"load-{self.plan.seed}-{self.index:04d}-{self.runs}"
        self.runs += 1
        update = Update(
            update_id=update_id,
            client_id=self.client_id,
            base_version=self.held.version,
            num_samples=int(self.rng.integers(50, 200)),
            weights=weights.astype(np.float32),
            created_at=time.time(),
        )
        raw = encode_update(update)
        try:
            async with PUBLISHING:  # within the client's pool: a full pool fails, not waits
                entry: Any = await self.redis.xadd(self.keys.updates, stream_entry.build(raw))
        except Exception as exc:  # whatever it was, the audit must know the outcome is open
            self.rec.uncertain.add(update_id)
            self._error(f"publish {type(exc).__name__}")
            return
        t = self.rec.now()
        self.rec.published[update_id] = (bytes(entry).decode(), t)
        self.rec.at(t).published += 1

    def _error(self, what: str) -> None:
        self.rec.at(self.rec.now()).errors[what] += 1


async def probe_loop_lag(rec: Recorder, stop: asyncio.Event) -> None:
    """How late the client's event loop wakes a sleeper: its own share of every latency."""
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        rec.at(rec.now()).loop_lag.append(time.perf_counter() - before - LAG_PROBE_S)


async def poll_status(
    rec: Recorder, session: aiohttp.ClientSession, control_url: str, stop: asyncio.Event
) -> None:
    """The control service's own view every half second: rate, switches, backlog."""
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with session.get(control_url + "/v1/status") as response:
                status = await response.json()
            rec.status.append(
                {
                    "t": round(rec.now(), 3),
                    "update_rate": status["recent"]["update_rate"],
                    "switches_on": status["switches_on"],
                    "backlog": int(status["pending"]) + int(status["lag"]),
                    "version": status["version"],
                }
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STATUS_EVERY_S)


async def drive(plan: Plan, settings: Settings, snapshot_url: str, control_url: str) -> Recorder:
    """Run the fleet for `plan.end` seconds; each device's last publish lands before return."""
    keys = Keys(settings.redis.key_prefix)
    redis = connect(settings.redis)
    connector = aiohttp.TCPConnector(limit=plan.devices + 16)
    timeout = aiohttp.ClientTimeout(total=plan.wait_s + 30)
    rec = Recorder(plan, time.time())
    stop = asyncio.Event()
    publishes: set[asyncio.Task[None]] = set()
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            devices = [
                Device(i, plan, rec, session, redis, keys, snapshot_url)
                for i in range(plan.devices)
            ]
            side = [
                asyncio.create_task(probe_loop_lag(rec, stop)),
                asyncio.create_task(poll_status(rec, session, control_url, stop)),
            ]
            running = [asyncio.create_task(d.live(publishes)) for d in devices]
            done, late = await asyncio.wait(running, timeout=plan.end + plan.wait_s + 30)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            for task in done:
                task.result()  # a device that failed is a bug of the benchmark: say so
            await asyncio.gather(*publishes)
            stop.set()
            await asyncio.gather(*side)
    finally:
        await redis.aclose()
    return rec


# ------------------------------------------------------------------------- the check at the end
async def drain(redis: aioredis.Redis, keys: Keys, published: int, timeout: float = 60.0) -> None:
    """Wait until the aggregator has read, decided and committed every entry."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups: Any = await redis.xinfo_groups(keys.updates)
        group = next(
            g for g in groups if g["name"] in (AGGREGATOR_GROUP, AGGREGATOR_GROUP.encode())
        )
        idle = int(group["pending"]) == 0 and int(group.get("lag") or 0) == 0
        if idle and int(await redis.xlen(keys.ledger)) >= published:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the aggregator did not decide every update within {timeout:.0f} s")


async def audit(settings: Settings, rec: Recorder) -> dict[str, Any]:
    """Every acknowledged update decided exactly once (services/stores/exactly_once.py), on
    the entry Redis acknowledged; nothing pending; the ledger replays."""
    keys = Keys(settings.redis.key_prefix)
    redis = connect(settings.redis)
    try:
        found = [record async for record in records(redis, keys)]
        entry_ids = [entry async for entry, _ in stream_entries(redis, keys.updates)]
        acknowledged = set(rec.published)
        verdict = check(
            acknowledged,
            acknowledged | rec.uncertain,
            [Decided.from_record(r) for r in found],
            entry_ids,
            entries={u: entry for u, (entry, _) in rec.published.items()},
        )
        by_policy = Counter(int(r["policy_version"]) for r in found)
        taus = [int(r["tau"]) for r in found if r["tau"] is not None]
        groups: Any = await redis.xinfo_groups(keys.updates)
        pending = sum(int(g["pending"]) + int(g.get("lag") or 0) for g in groups)
        report = await verify(redis, keys, settings.wire.max_message_bytes)
        return {
            "published": len(rec.published),
            "uncertain": len(rec.uncertain),
            "decisions": len(found),
            "outcomes": dict(verdict.outcomes),
            "tau": {
                "p50": float(np.percentile(taus, 50)) if taus else None,
                "p95": float(np.percentile(taus, 95)) if taus else None,
                "max": max(taus, default=None),
            },
            "decisions_by_policy_version": {str(v): n for v, n in sorted(by_policy.items())},
            "missing": len(verdict.lost),
            "decided_more_than_once": len(verdict.duplicated) + len(verdict.redecided),
            "wrong_entry": len(verdict.wrong_entry),
            "unexpected": len(verdict.unexpected),
            "version_gaps": len(verdict.version_gaps),
            "undecided_entries": len(verdict.undecided),
            "pending": pending,
            "verify_ok": report.ok,
            "verify": report.describe(),
            "version": report.version,
            "nothing_lost": verdict.ok and pending == 0 and report.ok,
        }
    finally:
        await redis.aclose()


# ------------------------------------------------------------------------------- the figures
def _ms(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    p50, p95, p99 = np.percentile(np.asarray(values) * 1000, [50, 95, 99])
    return {"n": len(values), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def summarize(rec: Recorder, cpu: dict[str, dict[str, float]]) -> dict[str, Any]:
    plan = rec.plan
    start, end = plan.bounds
    phases = {}
    for name, f in rec.phases.items():
        seconds = plan.phase_seconds(name)
        if seconds <= 0:
            continue
        fetches = len(f.full) + len(f.not_modified) + len(f.wake)
        in_phase = [s for s in rec.status if plan.phase_of(s["t"]) == name]
        phases[name] = {
            "seconds": seconds,
            "target_updates_per_s": plan.rate * (plan.rate_factor if name == "spike" else 1),
            "published_per_s": f.published / seconds,
            "fetches_per_s": fetches / seconds,
            "mb_per_s": f.bytes / seconds / 1e6,
            "fetch_200_ms": _ms(f.full),
            "fetch_304_ms": _ms(f.not_modified),
            "wake_ms": _ms(f.wake),
            "long_poll_timeouts": f.timeouts,
            "errors": dict(f.errors),
            "loop_lag_ms": _ms(f.loop_lag),
            "control_rate_max": max((s["update_rate"] for s in in_phase), default=None),
            "backlog_max": max((s["backlog"] for s in in_phase), default=None),
            "cpu_percent": cpu.get(name, {}),
        }
    return {"phases": phases, "rule": rule_timeline(rec, start, end)}


def rule_timeline(rec: Recorder, spike_start: float, spike_end: float) -> dict[str, Any]:
    """When the control service saw raise-gamma on, from its status samples."""
    on = [s["t"] for s in rec.status if "raise-gamma" in s["switches_on"]]
    return {
        "first_seen_on": min(on, default=None),
        "last_seen_on": max(on, default=None),
        "spike": [spike_start, spike_end],
    }


async def policy_log(settings: Settings, t0: float) -> list[dict[str, Any]]:
    """Who changed the policy and when (seconds since the load started), from the policy log."""
    keys = Keys(settings.redis.key_prefix)
    redis = connect(settings.redis)
    try:
        entries = await read_policy_log(redis, keys)
    finally:
        await redis.aclose()
    return [{"t": round(e["at"] - t0, 3), "who": e["who"], "why": e["why"]} for e in entries]


class CpuClock:
    """CPU seconds of processes (from /proc) sampled at phase boundaries: % of one core."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.marks: list[tuple[float, dict[str, float]]] = []

    def _cpu(self, pid: int, name: str) -> float:
        """The process's CPU seconds; the snapshot service's with its workers' (its children)."""
        try:
            own = process_cpu(pid)
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return math.nan
        if name != "snapshot":
            return own
        return own + sum(self._cpu(int(child), name) for child in children)

    def mark(self) -> None:
        self.marks.append((time.monotonic(), {n: self._cpu(p, n) for n, p in self.pids.items()}))

    def shares(self) -> dict[str, dict[str, float]]:
        out = {}
        for phase, (a, b) in zip(
            PHASES, zip(self.marks, self.marks[1:], strict=False), strict=False
        ):
            wall = b[0] - a[0]
            if wall <= 0:
                continue
            out[phase] = {n: round(100 * (b[1][n] - a[1][n]) / wall, 1) for n in self.pids}
        return out


async def mark_phases(plan: Plan, clock: CpuClock, t0: float) -> None:
    clock.mark()
    for boundary in (plan.warmup, *plan.bounds, plan.end):
        await asyncio.sleep(max(boundary - (time.time() - t0), 0.0))
        clock.mark()


# ------------------------------------------------------------------------------------ running
def configure(plan: Plan, redis_url: str, ports: dict[str, int]) -> Settings:
    """The services' settings: this Redis, these ports, a rule that can act within the spike."""
    return load_settings(
        redis={"url": redis_url, "key_prefix": "load"},
        task={"name": plan.task, "seed": plan.seed},
        # τ grows with the fleet (every update is a version): keep the updates applied
        policy={"tau_max": 1000},
        budget={"max_updates": 10**9, "max_seconds": 10.0**6},
        aggregator={"host": HOST, "port": ports["aggregator"]},
        snapshot={
            "host": HOST,
            "port": ports["snapshot"],
            "max_waiters": plan.devices + 100,
            "workers": plan.snapshot_workers,
        },
        control={
            "host": HOST,
            "port": ports["control"],
            "rules_interval_s": 0.25,
            "window_s": WINDOW_S,
            "hold_s": HOLD_S,
            "cooldown_s": 1.0,
            "rate_high": plan.rate_high,
            "rate_low": plan.rate_low,
            "open_reads": True,  # the load reads /v1/status without the token
        },
        # every device holds a connection (a long-poll) to the snapshot service
        http={"max_connections": max(1024, plan.devices + 200)},
        log={"level": "INFO"},
    )


async def run_load(
    plan: Plan, settings: Settings, supervisor: Supervisor, redis_pid: int
) -> dict[str, Any]:
    urls = {n: f"http://{HOST}:{getattr(settings, n).port}" for n in ("snapshot", "control")}
    pids = {n: supervisor.children[n].pid for n in SERVICES}
    pids |= {"redis": redis_pid, "devices": os.getpid()}
    clock = CpuClock(pids)
    load_before = os.getloadavg()[0]
    marker = asyncio.create_task(mark_phases(plan, clock, time.time()))
    rec = await drive(plan, settings, urls["snapshot"], urls["control"])
    await marker
    crashed = [c.spec.name for c in supervisor.crashed()]
    keys = Keys(settings.redis.key_prefix)
    redis = connect(settings.redis)
    try:
        await drain(redis, keys, len(rec.published))
    finally:
        await redis.aclose()
    results = summarize(rec, clock.shares())
    results["policy_log"] = await policy_log(settings, rec.t0)
    results["status"] = rec.status
    results["crashed"] = crashed
    results["load_average"] = [load_before, os.getloadavg()[0]]
    results["_recorder"] = rec
    return results


def model_size(task: str) -> int:
    from fedasync.learning.tasks import get_task

    return get_task(task).layout.size


def fmt_ms(figures: dict[str, float | int]) -> str:
    if not figures.get("n"):
        return "-"
    return f"{figures['p50']:.1f} / {figures['p95']:.1f} / {figures['p99']:.1f}"


def report(plan: Plan, results: dict[str, Any], ledger: dict[str, Any]) -> None:
    start, end = plan.bounds
    size = model_size(plan.task)
    phases: dict[str, dict[str, Any]] = results["phases"]
    print(
        f"load: {plan.devices} devices, task {plan.task} ({size} parameters); "
        f"{plan.warmup:g} s warm-up, then {plan.seconds:g} s: {plan.rate:g} updates/s, "
        f"×{plan.rate_factor:g} ({plan.rate * plan.rate_factor:g}/s) from {start:g} s to "
        f"{end:g} s, {plan.rate:g}/s again until {plan.end:g} s; "
        f"{plan.snapshot_workers} snapshot worker(s); "
        f"{os.cpu_count()} CPUs shared by devices, services and Redis"
    )
    print(
        f"\n{'phase':<8} {'updates/s':>14} {'fetches/s':>10} {'MB/s':>6} {'204/s':>6} "
        f"{'errors':>6} {'control rate max':>17} {'backlog max':>12}"
    )
    for name, p in phases.items():
        rate = f"{p['published_per_s']:.1f} (of {p['target_updates_per_s']:g})"
        control = "-" if p["control_rate_max"] is None else f"{p['control_rate_max']:.1f}"
        backlog = "-" if p["backlog_max"] is None else str(p["backlog_max"])
        print(
            f"{name:<8} {rate:>14} {p['fetches_per_s']:>10.0f} {p['mb_per_s']:>6.2f} "
            f"{p['long_poll_timeouts'] / p['seconds']:>6.1f} {sum(p['errors'].values()):>6} "
            f"{control:>17} {backlog:>12}"
        )
    print(f"\n{'phase':<8} {'ms p50 / p95 / p99 (count)':>34}")
    for label, key in (
        ("200", "fetch_200_ms"),
        ("304", "fetch_304_ms"),
        ("wake-up", "wake_ms"),
        ("loop lag", "loop_lag_ms"),
    ):
        cells = "  ".join(f"{n}: {fmt_ms(p[key])} ({p[key]['n']})" for n, p in phases.items())
        print(f"{label:<8} {cells}")
    print("\nCPU, % of one core")
    for name, p in phases.items():
        print(f"{name:<8} " + ", ".join(f"{k} {v:.0f}" for k, v in p["cpu_percent"].items()))
    print(
        f"\nrule update-rate (raise-gamma on above {plan.rate_high:g}/s, off below "
        f"{plan.rate_low:g}/s, window {WINDOW_S:g} s, hold {HOLD_S:g} s):"
    )
    changes = [e for e in results["policy_log"] if e["who"] == "rule:update-rate"]
    if not changes:
        print("  never fired")
    for change in changes:
        t = change["t"]
        where = f"spike start {t - start:+.1f} s" if t < end else f"spike end {t - end:+.1f} s"
        print(f"  at {t:5.1f} s ({where}): {change['why']}")
    verdict = "nothing lost" if ledger["nothing_lost"] else "LOST OR DOUBLED UPDATES"
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(ledger["outcomes"].items()))
    print(
        f"{verdict}: {ledger['published']} updates acknowledged, {ledger['decisions']} decisions "
        f"({outcomes}); lost {ledger['missing']}, decided twice "
        f"{ledger['decided_more_than_once']}, wrong entry {ledger['wrong_entry']}, unexpected "
        f"{ledger['unexpected']}, version gaps {ledger['version_gaps']}, undecided entries "
        f"{ledger['undecided_entries']}, pending {ledger['pending']}, publish errors "
        f"{ledger['uncertain']}"
    )
    print(ledger["verify"])
    versions = ", ".join(f"v{v} {n}" for v, n in ledger["decisions_by_policy_version"].items())
    print(f"decisions by policy version (the rule's switches are versions): {versions}")
    tau = ledger["tau"]
    if tau["max"] is not None:
        print(f"staleness τ: p50 {tau['p50']:.0f}, p95 {tau['p95']:.0f}, max {tau['max']}")
    before, after = results["load_average"]
    print(f"load average (1 min) of the machine: {before:.2f} before, {after:.2f} after")
    if results["crashed"]:
        print(f"CRASHED: {', '.join(results['crashed'])}")


def _plan() -> tuple[Plan, argparse.Namespace]:
    """The plan the command line asks for (argparse's exit 2 for one it refuses)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured load, seconds")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="normal rate before measuring, seconds"
    )
    parser.add_argument("--rate", type=float, default=10.0, help="normal updates/s, whole fleet")
    parser.add_argument("--rate-factor", type=float, default=4.0, help="spike / normal rate")
    parser.add_argument("--task", default="digits", help="digits (2410 parameters) or linear")
    parser.add_argument("--wait", type=float, default=10.0, help="longest long-poll, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--snapshot-workers", type=int, default=2, help="FEDASYNC_SNAPSHOT__WORKERS"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    parser.add_argument("--keep", action="store_true", help="keep Redis data and service logs")
    args = parser.parse_args()
    if args.rate_factor < 2:
        parser.error("--rate-factor must be at least 2 for the rule's thresholds to sit between")
    plan = Plan(
        args.devices,
        args.seconds,
        args.rate,
        args.rate_factor,
        args.seed,
        args.task,
        args.wait,
        args.warmup,
        args.snapshot_workers,
    )
    return plan, args


def _measured(plan: Plan, server: RedisServer, work: Path) -> tuple[Settings, dict[str, Any]]:
    """The services started on `server` (each ready before the next), the load run against
    them, then the services stopped: their settings and what the load measured."""
    ports = {name: free_port() for name in SERVICES}
    settings = configure(plan, server.url, ports)
    child_env = settings_env(settings)
    with Supervisor(work / "logs", cwd=ROOT) as supervisor:
        for name in SERVICES:
            ready = f"http://{HOST}:{ports[name]}/readyz"
            supervisor.start(ServiceSpec(name, f"fedasync.services.{name}", child_env, ready))
            supervisor.wait_ready(name, timeout=60)
        assert server.process is not None
        with asyncio.Runner(loop_factory=new_event_loop) as runner:  # as the services'
            results = runner.run(run_load(plan, settings, supervisor, server.process.pid))
        supervisor.stop_all(groups=[["control", "snapshot"], ["aggregator"]])
    return settings, results


def _document(plan: Plan, results: dict[str, Any], ledger: dict[str, Any]) -> dict[str, Any]:
    """What load.json holds: the plan, the machine's CPUs, the figures and the ledger's audit."""
    return {
        "plan": {
            "devices": plan.devices,
            "seconds": plan.seconds,
            "rate": plan.rate,
            "rate_factor": plan.rate_factor,
            "seed": plan.seed,
            "task": plan.task,
            "parameters": model_size(plan.task),
            "wait_s": plan.wait_s,
            "warmup": plan.warmup,
            "snapshot_workers": plan.snapshot_workers,
            "spike": list(plan.bounds),
            "rate_high": plan.rate_high,
            "rate_low": plan.rate_low,
            "window_s": WINDOW_S,
            "hold_s": HOLD_S,
        },
        "cpus": os.cpu_count(),
        **results,
        "ledger": ledger,
    }


def main() -> int:
    plan, args = _plan()
    work = Path(tempfile.mkdtemp(prefix="fedasync-load-"))
    server = RedisServer(work / "redis")
    server.start()
    ok = False
    try:
        settings, results = _measured(plan, server, work)
        rec: Recorder = results.pop("_recorder")
        ledger = asyncio.run(audit(settings, rec))
        report(plan, results, ledger)
        ok = ledger["nothing_lost"] and not results["crashed"]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_document(plan, results, ledger), indent=1) + "\n")
        print(f"written to {args.out}")
    finally:
        server.stop()
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"Redis data and service logs kept in {work}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
