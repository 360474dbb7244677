"""What durable mode costs a publisher: XADDs per second with WAIT and without, side by side.

A primary and one replica, each a private redis-server (AOF, `appendfsync always`); the replica
follows the primary either directly (loopback: the replica on this host) or through a link that
delivers the replication stream `--lag-ms` late (services/commands/chaos/links.py: a replica on
another host). `--publishers` asyncio publishers each XADD an update-sized entry as fast as they
can, through `replicated` (services/runtime/redis_conn.py), the one code path of the ingest
service and the workers: durable mode off (XADD alone) and on (XADD, then WAIT 1 on the same
connection). Each round measures both (which goes first alternates), so both see the same
machine; the result is the ratio of the rates (on / off; 1.0 would be free).

Everything shares this machine's cores: the ratios, not the absolute rates, are the result.

Run: python bench/durable.py [--lag-ms 0 20] [--publishers 8] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from fedasync.services.commands.chaos.links import Links
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect, replicated
from fedasync.services.runtime.settings import Durability, RedisSettings

#: an update of the `linear` task is a few hundred bytes; a small model's, tens of kilobytes
PAYLOAD = b"x" * 4096
STREAM = "{bench}:updates"


async def rate(url: str, durability: Durability, publishers: int, seconds: float) -> float:
    """Entries acknowledged per second by `publishers` concurrent publishers."""
    client = connect(RedisSettings(url=url, socket_timeout_s=30.0))
    stop = time.monotonic() + seconds
    done = 0

    async def publisher() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await replicated(client, durability, lambda c: c.xadd(STREAM, {"m": PAYLOAD}))
            done += 1

    try:
        started = time.monotonic()
        await asyncio.gather(*(publisher() for _ in range(publishers)))
        elapsed = time.monotonic() - started
        await client.delete(STREAM)
    finally:
        await client.aclose()
    return done / elapsed


async def linked(url: str, timeout_s: float = 60.0) -> None:
    """Until the replica is in sync: a WAIT of our own returns."""
    client = connect(RedisSettings(url=url, socket_timeout_s=timeout_s + 5))
    try:
        await replicated(
            client, Durability(1, int(timeout_s * 1000)), lambda c: c.set("{bench}:probe", 1)
        )
    finally:
        await client.aclose()


def measure(lag_ms: int, publishers: int, seconds: float, rounds: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="fedasync-durable-") as scratch:
        root = Path(scratch)
        primary = RedisServer(root / "primary", extra_args=("--repl-diskless-sync-delay", "0"))
        primary.start()
        links = Links([primary.port], lag_ms / 1000) if lag_ms else None
        upstream = links.start()[primary.port] if links is not None else primary.port
        replica = RedisServer(
            root / "replica", extra_args=("--replicaof", "127.0.0.1", str(upstream))
        )
        try:
            replica.start()
            asyncio.run(linked(primary.url))
            off, on = [], []
            for round_ in range(rounds):
                order = [(off, 0), (on, 1)] if round_ % 2 == 0 else [(on, 1), (off, 0)]
                for figures, replicas in order:
                    durability = Durability(replicas, 5000)
                    figures.append(asyncio.run(rate(primary.url, durability, publishers, seconds)))
            return statistics.median(off), statistics.median(on)
        finally:
            replica.stop()
            if links is not None:
                links.stop()
            primary.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lag-ms", type=int, nargs="+", default=[0, 20])
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.publishers} publishers, {len(PAYLOAD)} B entries, {args.rounds} rounds")
    print("| replica | XADD/s, durable off | XADD/s, durable on (WAIT 1) | on / off |")
    print("|---|---|---|---|")
    for lag_ms in args.lag_ms:
        off, on = measure(lag_ms, args.publishers, args.seconds, args.rounds)
        where = "on this host" if lag_ms == 0 else f"{lag_ms} ms behind"
        print(f"| {where} | {off:.0f} | {on:.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
