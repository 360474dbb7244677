"""Soak: far more update bytes than Redis's maxmemory, through the real aggregator, memory flat.

One private redis-server (AOF, appendfsync always, `noeviction`) with a small `maxmemory`; the
aggregator with a payload archive (FEDASYNC_AGGREGATOR__ARCHIVE_DIR), so each committed payload
goes to disk and out of the stream; the control service's rules (the memory rule among them)
ticking beside it; a publisher that XADDs fresh updates as fast as Redis takes them, waits while
`pause-ingest` is on (as the ingest service makes devices do) and retries a write Redis refuses
for want of memory. Training runs to its budget of applied updates; then the stream is drained.

Printed: bytes published ÷ maxmemory, Redis's used memory (first, peak, last), the out-of-memory
refusals and pause-ingest flips, the exactly-once audit (lost, decided twice) and `ledger
verify` read from the archive.

Run: python bench/soak.py [--maxmemory-mb 16] [--parameters 100000] [--updates 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.control.rules_runner import RuleRunner
from fedasync.services.runtime.redis_conn import connect, get_bytes, is_out_of_memory
from fedasync.services.runtime.settings import load_settings
from fedasync.services.stores.archive import PayloadArchive
from fedasync.services.stores.backlog import read_backlog
from fedasync.services.stores.ledger import records, verify
from fedasync.services.stores.memory import read_memory
from fedasync.services.stores.policy_store import read_policy
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.keys import Keys
from fedasync.shared.layout import Layout
from fedasync.shared.update import Update
from fedasync.shared.wire import DEFAULT_MAX_MESSAGE_BYTES, encode_update


async def publish(
    redis: aioredis.Redis, keys: Keys, size: int, done: asyncio.Event, tally: Counter[str]
) -> list[str]:
    """XADD fresh updates until training is done; returns the ids Redis acknowledged."""
    rng = np.random.default_rng(0)
    acknowledged: list[str] = []
    while not done.is_set():
        policy = await read_policy(redis, keys)
        if policy.ingest_paused:
            tally["waits while pause-ingest"] += 1
            await asyncio.sleep(0.05)
            continue
        version = int(await get_bytes(redis, keys.version) or 0)
        update_id = f"u{len(acknowledged)}"
        weights = rng.standard_normal(size).astype(np.float32) * 0.01
        message = encode_update(
            Update(update_id, f"c{len(acknowledged) % 50}", version, 10, weights)
        )
        try:
            await redis.xadd(keys.updates, stream_entry.build(message))
        except ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            tally["publishes refused: out of memory (retried)"] += 1
            await asyncio.sleep(0.05)
            continue
        acknowledged.append(update_id)
        tally["bytes published"] += len(message)
    return acknowledged


async def sample_memory(redis: aioredis.Redis, stop: asyncio.Event, seen: list[int]) -> None:
    while not stop.is_set():
        seen.append((await read_memory(redis)).used)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def tick_rules(runner: RuleRunner, stop: asyncio.Event, tally: Counter[str]) -> None:
    while not stop.is_set():
        for action in await runner.tick():
            tally[f"rule {action.rule}: {action.kind.value} {action.switch or ''}".strip()] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def soak(maxmemory_mb: int, size: int, budget: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        limit = maxmemory_mb * 1024 * 1024
        server = RedisServer(Path(tmp) / "redis", extra_args=("--maxmemory", str(limit)))
        server.start()
        archive_dir = Path(tmp) / "archive"
        settings = load_settings(
            redis={"url": server.url, "key_prefix": "soak"},
            aggregator={"archive_dir": str(archive_dir), "port": None},
            budget={"max_updates": budget, "max_seconds": 10**9},
            control={"memory_high": 0.8, "memory_low": 0.6, "hold_s": 0, "cooldown_s": 0},
        )
        keys = Keys("soak")
        redis = connect(settings.redis)
        try:
            initial = AggregationState(np.zeros(size, np.float32), Layout.flat(size))
            stopping, stop, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
            tally: Counter[str] = Counter()
            memory: list[int] = []
            started = time.perf_counter()
            aggregator = asyncio.create_task(
                run_aggregator(
                    settings, redis=redis, initial=initial, handle_signals=False, stopping=stopping
                )
            )
            while await redis.get(keys.version) is None:  # the genesis commit
                await asyncio.sleep(0.05)
            sampler = asyncio.create_task(sample_memory(redis, stop, memory))
            rules = asyncio.create_task(
                tick_rules(RuleRunner(settings.control, redis, keys), stop, tally)
            )
            publisher = asyncio.create_task(publish(redis, keys, size, done, tally))
            while not await redis.exists(keys.done):
                await asyncio.sleep(0.1)
            done.set()
            acknowledged = await publisher
            while (await read_backlog(redis, keys)).waiting:  # everything published is decided
                await asyncio.sleep(0.1)
            stopping.set()
            await aggregator
            stop.set()
            await asyncio.gather(sampler, rules)
            elapsed = time.perf_counter() - started

            decided: Counter[str] = Counter()
            async for record in records(redis, keys):
                if record["outcome"] != "duplicate":
                    decided[str(record["update_id"])] += 1
            lost = sum(1 for u in acknowledged if decided[u] == 0)
            twice = sum(1 for n in decided.values() if n > 1)
            report = await verify(
                redis, keys, DEFAULT_MAX_MESSAGE_BYTES, PayloadArchive(archive_dir, "soak")
            )
            stream_length = int(await redis.xlen(keys.updates))
        finally:
            await redis.aclose()
            server.stop()
    published = tally.pop("bytes published")
    print(
        f"parameters {size}, maxmemory {maxmemory_mb} MB, budget {budget} applied, {elapsed:.0f} s"
    )
    print(f"published: {len(acknowledged)} updates, {published / 2**20:.0f} MB")
    print(f"bytes published / maxmemory: {published / limit:.1f}")
    third, mb = max(1, len(memory) // 3), 2**20
    print(
        f"Redis used memory: first {memory[0] / mb:.1f} MB, peak {max(memory) / mb:.1f} MB "
        f"({max(memory) / limit:.0%} of maxmemory); peak in the first third of the run "
        f"{max(memory[:third]) / mb:.1f} MB, in the last third {max(memory[-third:]) / mb:.1f} MB; "
        f"last {memory[-1] / mb:.1f} MB"
    )
    print(f"updates stream at the end: {stream_length} entries")
    for what, count in sorted(tally.items()):
        print(f"{what}: {count}")
    print(f"exactly once: acknowledged {len(acknowledged)}, lost {lost}, decided twice {twice}")
    print(report.describe())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--maxmemory-mb", type=int, default=16)
    parser.add_argument("--parameters", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=600, help="applied updates (the budget)")
    args = parser.parse_args()
    asyncio.run(soak(args.maxmemory_mb, args.parameters, args.updates))


if __name__ == "__main__":
    main()
