"""Aggregator throughput against raw Redis consumption of the same payloads, side by side.

For each model size, the same updates are put in two streams of one private redis-server (AOF,
appendfsync always, as in production). Raw: redis-py XREADGROUP + XACK, nothing else. Ours: the
aggregator in burst mode (decode, decide through the core, group-commit state, model, ledger and
acknowledgements atomically). Both are timed from "all updates in the stream" to "all consumed
and acknowledged"; the ratio is what exactly-once costs. Also: seconds from an aggregator
restart after kill -9 to its next commit.

Automatic AOF rewrites are off and the AOF is rewritten between runs (`settle_aof`): a rewrite
forks the server, and one falling inside a timed run, on either side, was the largest source of
scatter between runs; every write is still fsynced before its reply.

Both read the same number of entries per XREADGROUP (`--batch`, fewer for models so large that
they would exceed ~256 MB a read); the aggregator commits with its defaults
(group commit of up to 256 decisions or 50 ms).

Also, against the same raw consumption of float32 payloads in the stream: the aggregator fed
float16 updates (`--fp16`, FEDASYNC_WIRE__DTYPE=float16: half the bytes) and claim-check updates
(`--claim-check`: the stream carries content addresses, the payloads sit in a directory store,
services/stores/claim_check.py, fetched and checked ahead of deciding).

Every run prints the commit, the cores and the load average first and last (bench/machine.py),
each row's spread (the lowest and highest ratio of its runs) and the load when the row ended, and
under each row the CPU per update of each side, median of its runs: the raw client's, Redis's
while the raw client consumed, ours (with `--reader process`, the deciding and the reader
process together), and Redis's while we consumed. Rates move with the
machine's load and the disk's fsync time; CPU per update moves far less, so a change in it is
a change in the work done per update (code), not a busier machine.

`--floor` prints, instead, the highest ratio any one-process Python aggregator could reach at
each size. One process has one thread holding the GIL, and at least two pieces of work per
update need it: reading the entry through the same client as the raw consumer (its own CPU per
update, measured while it consumes) and deciding it with the core the simulator shares
(`decode_update` and `AggregationState.apply` alone; the ledger record, commit and metrics are
left out, so the bound is generous). The wall time per update is no less than their sum, so
ours ÷ raw ≤ raw wall ÷ (raw CPU + decide CPU). A bound under a target says that reaching it
needs the reading or the deciding off the GIL (another process, compiled code) or another
client, not better overlap.

`--reader inline process` runs ours in one process and with the reader process
(`aggregator.reader = "process"`: XREADGROUP, parsing, signature checks and decoding in a
process of their own, handed over through shared memory) side by side with raw in one run; each
start-up (the aggregator's, and the reader process's spawn, printed) is left out of the timing.

Run: python bench/aggregator.py [--sizes 10000 100000 1000000] [--batch 32] [--fp16 1000000]
     [--reader inline process]
     [--claim-check 1000000 10000000]
     python bench/aggregator.py --floor [--sizes ...] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from machine import machine, process_cpu

from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import Aggregator
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.claim_check import ClaimStore
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Policy
from fedasync.shared.update import Update
from fedasync.shared.wire import decode_update, encode_update

ROOT = Path(__file__).resolve().parents[1]
#: updates per run at each size (others: 200)
COUNTS = {10_000: 2000, 100_000: 600, 1_000_000: 100, 10_000_000: 16}


def payloads(size: int, count: int, dtype: str = "float32") -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        weights = rng.standard_normal(size).astype(np.float32)
        update = Update(f"u{i}", f"c{i % 50}", max(i - 3, 0), 10, weights)
        out.append(encode_update(update, dtype))
    return out


async def fill(
    redis: aioredis.Redis, stream: str, raw: list[bytes], store: ClaimStore | None = None
) -> None:
    """The messages into `stream`; with a claim-check `store`, only their content addresses
    (the messages put in the store first, as a publisher does)."""
    per = max(1, min(16, (64 << 20) // max(len(raw[0]), 1)))  # at most ~64 MB per round trip
    for start in range(0, len(raw), per):
        pipe = redis.pipeline(transaction=False)
        for message in raw[start : start + per]:
            if store is None:
                pipe.xadd(stream, stream_entry.build(message))
            else:
                pipe.xadd(stream, stream_entry.build_claim(store.put(message)))
        await pipe.execute()


async def settle_aof(redis: aioredis.Redis) -> None:
    """Rewrite the AOF now, after a flush, and wait for it: no rewrite (a fork of a server
    holding hundreds of MB) then falls inside a timed run, on one side or the other, at random.
    Automatic rewrites are off for the whole bench (`main_async`); fsyncs stay as they are."""
    await redis.bgrewriteaof()
    while True:
        info: Any = await redis.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        await asyncio.sleep(0.05)


async def raw_cost(
    redis: aioredis.Redis, stream: str, count: int, batch: int
) -> tuple[float, float]:
    """The raw consumer: redis-py XREADGROUP + XACK, nothing else; (wall, CPU of this thread)
    per update."""
    await redis.xgroup_create(stream, "raw", id="0", mkstream=True)
    wall, cpu, done = time.perf_counter(), time.thread_time(), 0
    while done < count:
        reply: Any = await redis.xreadgroup("raw", "c", {stream: ">"}, count=batch)
        ids = [entry_id for entry_id, _ in reply[0][1]]
        await redis.xack(stream, "raw", *ids)
        done += len(ids)
    return (time.perf_counter() - wall) / count, (time.thread_time() - cpu) / count


def decide_cpu(size: int, raw: list[bytes]) -> float:
    """CPU per update to decode each message and apply it through the core, nothing else."""
    state = AggregationState(np.zeros(size, np.float32), Layout.flat(size))
    policy = Policy()
    cpu = time.thread_time()
    for message in raw:
        state.apply(decode_update(message, 1 << 40), policy)
    return (time.thread_time() - cpu) / len(raw)


async def floor(redis: aioredis.Redis, sizes: list[int], batch: int, repeat: int) -> None:
    """The bound on ours ÷ raw at each size (module docstring), each run's sides back to back."""
    print(f"median of {repeat} runs; per update, in µs")
    print(f"{'parameters':>11} {'raw wall':>9} {'raw CPU':>8} {'decide CPU':>11} {'bound':>6}")
    for size in sizes:
        count = COUNTS.get(size, 200)
        per_read = entries_per_read(batch, size)
        raw = payloads(size, count)
        walls, cpus, decides, bounds = [], [], [], []
        for run in range(repeat):
            stream = f"floor-{size}-{run}"
            await fill(redis, stream, raw)
            wall, cpu = await raw_cost(redis, stream, count, per_read)
            await redis.delete(stream)
            await settle_aof(redis)
            decide = decide_cpu(size, raw)
            walls.append(wall)
            cpus.append(cpu)
            decides.append(decide)
            bounds.append(wall / (cpu + decide))
        spread = ", ".join(f"{b:.2f}" for b in sorted(bounds))
        print(
            f"{size:>11} {statistics.median(walls) * 1e6:>9.1f} "
            f"{statistics.median(cpus) * 1e6:>8.1f} {statistics.median(decides) * 1e6:>11.1f} "
            f"{statistics.median(bounds):>6.2f}   (bounds {spread})",
            flush=True,
        )
        del raw


def _ours_cpu(reader: str) -> str:
    """The CPU column of our side: one process, or the decider and the reader together."""
    return "ours inline" if reader == "inline" else f"ours {reader} (decider + reader)"


def entries_per_read(batch: int, size: int) -> int:
    """`batch` entries per XREADGROUP, fewer if they would exceed ~256 MB of float32."""
    return min(batch, max(1, (256 << 20) // (4 * size)))


async def ours(
    settings: Settings,
    redis: aioredis.Redis,
    size: int,
    raw: list[bytes],
    store: ClaimStore | None = None,
    redis_pid: int | None = None,
) -> tuple[float, float, float, float]:
    """Our updates/s, timed from "all updates in the stream" to "all decided and committed";
    the reader process's start-up (0 in one-process mode), which is not timed; and the CPU per
    update of that timed stretch: ours (this process, plus the reader process's in process
    mode, followed while it runs) and Redis's (if its pid is given).

    The aggregator is started (fenced, restored) before the stream is filled, in both modes. In
    process mode the reader is spawned after the fill and the clock starts when it connects to
    Redis, so it has read nothing before the clock starts (an earlier version spawned it before
    the fill, and it read up to a ring's worth ahead: up to 62 of 100 updates at 1M)."""
    keys = Keys(settings.redis.key_prefix)
    initial = AggregationState(np.zeros(size, np.float32), Layout.flat(size))
    await run_aggregator(settings, redis=redis, initial=initial, handle_signals=False, burst=True)
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(None)
    await fill(redis, keys.updates, raw, store)
    spawn = 0.0
    feed = aggregator.feed
    if feed is not None:
        # the reader is spawned once the stream is full, and the clock starts when it connects
        # to Redis (its first command is its first read): its spawn is left out, and it reads
        # nothing before the clock starts, as the raw consumer reads nothing before its own
        before: Any = {client["id"] for client in await redis.client_list()}
        began = time.perf_counter()
        feed.start(size)
        while not {client["id"] for client in await redis.client_list()} - before:
            await asyncio.sleep(0.001)
        spawn = time.perf_counter() - began
    reader_pid = feed.pid if feed is not None else None
    redis_before = process_cpu(redis_pid) if redis_pid is not None else 0.0
    reader_cpu = [process_cpu(reader_pid)] * 2 if reader_pid is not None else [0.0, 0.0]

    async def follow_reader() -> None:
        """The reader's CPU, read every 5 ms: a burst run stops it before returning, and its
        /proc entry goes with it, so the last reading is the figure (at most 5 ms short)."""
        assert reader_pid is not None
        with contextlib.suppress(OSError, IndexError, ValueError):
            while True:
                reader_cpu[1] = process_cpu(reader_pid)
                await asyncio.sleep(0.005)

    follower = asyncio.ensure_future(follow_reader()) if reader_pid is not None else None
    start, cpu = time.perf_counter(), time.process_time()
    await aggregator.run(asyncio.Event(), burst=True)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    if follower is not None:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    cpu += reader_cpu[1] - reader_cpu[0]
    redis_cpu = process_cpu(redis_pid) - redis_before if redis_pid is not None else 0.0
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    return len(raw) / elapsed, spawn, cpu / len(raw), redis_cpu / len(raw)


async def next_decision(redis: aioredis.Redis, ledger: str, after: str) -> str:
    """Block until a commit appends to the ledger after `after`; its entry id."""
    reply: Any = await redis.xread({ledger: after}, block=30_000, count=1)
    if not reply:
        raise TimeoutError("no commit within 30 s")
    return str(reply[0][1][0][0].decode())


async def recovery(settings: Settings, redis: aioredis.Redis, server: RedisServer) -> float:
    """kill -9 the aggregator process mid-stream; time from restart to its next commit."""
    keys = Keys(settings.redis.key_prefix)
    env = dict(
        os.environ,
        FEDASYNC_REDIS__URL=server.url,
        FEDASYNC_REDIS__KEY_PREFIX=settings.redis.key_prefix,
        FEDASYNC_TASK__NAME="linear",
        FEDASYNC_LOG__LEVEL="WARNING",
        FEDASYNC_AGGREGATOR__PORT="0",
    )
    size = get_task("linear").layout.size
    work = payloads(size, 400)
    first = subprocess.Popen(
        [sys.executable, "-m", "fedasync.services.aggregator"], cwd=ROOT, env=env
    )
    try:
        await fill(redis, keys.updates, work[:200])
        last = await next_decision(redis, keys.ledger, "0-0")
    finally:
        first.kill()  # mid-stream: whatever it had decided but not committed is lost
        first.wait()
    await fill(redis, keys.updates, work[200:])
    tail: Any = await redis.xrevrange(keys.ledger, count=1)
    last = tail[0][0].decode()
    start = time.perf_counter()
    second = subprocess.Popen(
        [sys.executable, "-m", "fedasync.services.aggregator"], cwd=ROOT, env=env
    )
    try:
        await next_decision(redis, keys.ledger, last)
        return time.perf_counter() - start
    finally:
        second.kill()
        second.wait()


async def main_async(
    sizes: list[int],
    batch: int,
    repeat: int,
    fp16: list[int],
    claim_check: list[int],
    bound_only: bool = False,
    readers: tuple[str, ...] = ("inline",),
) -> None:
    rows = [(size, "float32") for size in sizes]
    rows += [(size, "float16") for size in fp16] + [(size, "claim-check") for size in claim_check]
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            admin = aioredis.Redis.from_url(server.url)
            try:  # rewrites happen between runs only (settle_aof)
                await admin.config_set("auto-aof-rewrite-percentage", 0)
                if bound_only:
                    await floor(admin, sizes, batch, repeat)
                    return
            finally:
                await admin.aclose()
            print(machine(), flush=True)
            print(f"median of {repeat} alternating runs; raw always consumes float32 in-stream")
            print(
                f"{'parameters':>11} {'ours':>12} {'reader':>8} {'updates':>8} {'raw/s':>9} "
                f"{'ours/s':>9} {'ours/raw':>9}"
            )
            for size, mode in rows:
                count = COUNTS.get(size, 200)
                # both sides read as many entries per XREADGROUP
                per_read = entries_per_read(batch, size)
                raw = payloads(size, count)
                mine = payloads(size, count, "float16") if mode == "float16" else raw
                claim_dir = Path(tmp) / f"objects-{size}"
                by_reader = {
                    reader: load_settings(
                        redis={
                            "url": server.url,
                            "key_prefix": f"bench-{size}-{reader}",
                            "socket_timeout_s": 120,
                        },
                        aggregator={"read_count": per_read, "reader": reader},
                        budget={"max_updates": 10**9, "max_seconds": 10**9},
                        wire={"claim_check_dir": str(claim_dir) if mode == "claim-check" else None},
                    )
                    for reader in readers
                }
                redis = connect(by_reader[readers[0]].redis)
                raw_rates: list[float] = []
                our_rates: dict[str, list[float]] = {reader: [] for reader in readers}
                spawns: list[float] = []
                assert server.process is not None
                redis_pid = server.process.pid
                #: CPU µs per update: the raw client, Redis for raw, then ours and Redis for ours
                #: in each reader mode
                cpu: dict[str, list[float]] = {"raw": [], "redis-raw": []}
                for reader in readers:
                    cpu[_ours_cpu(reader)], cpu[f"redis {reader}"] = [], []
                try:
                    for _ in range(repeat):  # raw, then each reader mode, alternating
                        await fill(redis, f"raw-{size}", raw)
                        before = process_cpu(redis_pid)
                        wall, client_cpu = await raw_cost(redis, f"raw-{size}", count, per_read)
                        cpu["redis-raw"].append((process_cpu(redis_pid) - before) / count)
                        cpu["raw"].append(client_cpu)
                        raw_rates.append(1 / wall)
                        await redis.flushall()
                        await settle_aof(redis)
                        for reader, settings in by_reader.items():
                            store = ClaimStore(claim_dir) if mode == "claim-check" else None
                            rate, spawn, mine_cpu, redis_cpu = await ours(
                                settings, redis, size, mine, store, redis_pid
                            )
                            our_rates[reader].append(rate)
                            cpu[_ours_cpu(reader)].append(mine_cpu)
                            cpu[f"redis {reader}"].append(redis_cpu)
                            if reader == "process":
                                spawns.append(spawn)
                            await redis.flushall()
                            await settle_aof(redis)
                            shutil.rmtree(claim_dir, ignore_errors=True)
                finally:
                    await redis.aclose()
                del raw, mine
                raw_rate = statistics.median(raw_rates)
                for reader in readers:
                    rates = our_rates[reader]
                    ratios = sorted(o / r for o, r in zip(rates, raw_rates, strict=True))
                    spread = ", ".join(f"{x:.2f}" for x in ratios)
                    print(
                        f"{size:>11} {mode:>12} {reader:>8} {count:>8} {raw_rate:>9.1f} "
                        f"{statistics.median(rates):>9.1f} {statistics.median(ratios):>9.2f}   "
                        f"({ratios[0]:.2f}–{ratios[-1]:.2f}; ratios {spread}; "
                        f"load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
                print(
                    f"{'':>11} CPU µs per update, median: "
                    + ", ".join(
                        f"{name} {statistics.median(values) * 1e6:.0f}"
                        for name, values in cpu.items()
                    ),
                    flush=True,
                )
                if spawns:
                    print(
                        f"{'':>11} reader process start-up (not timed): median "
                        f"{statistics.median(spawns):.2f} s",
                        flush=True,
                    )
            settings = load_settings(redis={"url": server.url, "key_prefix": "bench-recovery"})
            redis = connect(settings.redis)
            try:
                seconds = await recovery(settings, redis, server)
                print(f"recovery: restart after kill -9 → next commit in {seconds:.2f} s")
                print(machine(), flush=True)
            finally:
                await redis.aclose()
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=32, help="entries per XREADGROUP, both sides")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs per size")
    parser.add_argument(
        "--fp16", type=int, nargs="*", default=[1_000_000], help="sizes with float16 updates"
    )
    parser.add_argument(
        "--claim-check",
        type=int,
        nargs="*",
        default=[1_000_000, 10_000_000],
        help="sizes with claim-check updates (payloads in a directory store)",
    )
    parser.add_argument(
        "--reader",
        nargs="+",
        choices=["inline", "process"],
        default=["inline"],
        help="aggregator.reader modes to run side by side (one-process, reader process)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="print the bound on ours/raw at each size (raw wall, raw CPU, decide CPU) instead",
    )
    args = parser.parse_args()
    asyncio.run(
        main_async(
            args.sizes,
            args.batch,
            args.repeat,
            args.fp16,
            args.claim_check,
            args.floor,
            tuple(args.reader),
        )
    )


if __name__ == "__main__":
    main()
