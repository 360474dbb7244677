"""Normal requests to the snapshot service with and without 200 slow clients, side by side.

The snapshot service runs as a real process (its production entry point) with a model committed
to a private redis-server. In each round the bench measures the latency of normal requests
(`GET /v1/models/latest`, a few at a time) twice: once with nothing else connected, once while
200 slowloris connections are held open, each sending its request head one byte per second.
Each round measures both conditions (which goes first alternates), so both see the same machine;
the figures are p50 and p99 over all rounds, and their ratios (with / without; 1.0 means the slow
clients cost nothing). Every slow client is held for the whole of its round: the header timeout
(`--header-timeout`, 10 s) is longer than a round.

Then it holds 200 slow connections until the service has closed every one of them, and reports
when (the service's `FEDASYNC_HTTP__HEADER_TIMEOUT_S`, set here to `--header-timeout`) and how
the service counted them (`fedasync_http_connections_closed_total{reason="header_timeout"}`).

Everything shares this machine's cores (the bench's clients, the service, Redis): the ratios, not
the absolute latencies, are the result.

Run: python bench/slow_clients.py [--slow 200] [--requests 1000] [--rounds 6] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import load_settings
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "bench-slow"
HEAD = b"GET /v1/models/latest HTTP/1.1\r\nHost: bench\r\nX-Slow: " + b"a" * 4096


async def commit_model(url: str, parameters: int) -> None:
    settings = load_settings(redis={"url": url, "key_prefix": PREFIX})
    redis = connect(settings.redis)
    try:
        weights = np.random.default_rng(0).standard_normal(parameters).astype(np.float32)
        state = AggregationState(weights, Layout.flat(parameters))
        await run_aggregator(settings, redis=redis, initial=state, handle_signals=False, burst=True)
    finally:
        await redis.aclose()


class Slowloris:
    """One slow client: connects, then sends its request head one byte per second."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened = asyncio.Event()
        self.closed_after: float | None = None  # seconds from connect to the server's EOF
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        start = time.perf_counter()
        self.opened.set()
        try:
            for byte in HEAD:
                writer.write(bytes([byte]))
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        break  # EOF: the server closed the connection
            self.closed_after = time.perf_counter() - start
        except ConnectionError:
            self.closed_after = time.perf_counter() - start
        finally:
            writer.close()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def open_slow(port: int, count: int) -> list[Slowloris]:
    slow = [Slowloris(port) for _ in range(count)]
    await asyncio.gather(*(s.opened.wait() for s in slow))
    return slow


async def open_connections(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("fedasync_http_connections_open "):
            return float(line.split()[1])
    raise RuntimeError("no fedasync_http_connections_open in /metrics")


async def latencies(
    session: aiohttp.ClientSession, base: str, requests: int, concurrency: int
) -> list[float]:
    """Seconds per `GET /v1/models/latest`, `concurrency` clients at a time."""
    out: list[float] = []
    remaining = iter(range(requests))

    async def client() -> None:
        for _ in remaining:
            start = time.perf_counter()
            async with session.get(f"{base}/v1/models/latest") as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
            out.append(time.perf_counter() - start)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return out


async def bench(port: int, args: argparse.Namespace) -> None:
    base = f"http://127.0.0.1:{port}"
    connector = aiohttp.TCPConnector(limit=args.concurrency + 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        await latencies(session, base, 50, args.concurrency)  # warm up
        without: list[float] = []
        with_slow: list[float] = []
        held: list[float] = []
        for index in range(args.rounds):
            if index % 2 == 0:  # the order alternates, so neither condition always goes first
                without += await latencies(session, base, args.requests, args.concurrency)
            slow = await open_slow(port, args.slow)
            held.append(await open_connections(session, base))
            with_slow += await latencies(session, base, args.requests, args.concurrency)
            held.append(await open_connections(session, base))
            await asyncio.gather(*(s.stop() for s in slow))
            if index % 2 == 1:
                without += await latencies(session, base, args.requests, args.concurrency)
        # held until the service closes them
        slow = await open_slow(port, args.slow)
        start = time.perf_counter()
        await asyncio.gather(*(s.task for s in slow))
        waited = time.perf_counter() - start
        async with session.get(f"{base}/metrics") as response:
            metrics = await response.text()
    closed = [s.closed_after for s in slow if s.closed_after is not None]
    header_closes = next(
        line.split()[1]
        for line in metrics.splitlines()
        if line.startswith('fedasync_http_connections_closed_total{reason="header_timeout"}')
    )
    p_without = np.percentile(without, [50, 99]) * 1000
    p_with = np.percentile(with_slow, [50, 99]) * 1000
    print(
        f"snapshot service, {args.rounds} rounds x {args.requests} requests per condition, "
        f"{args.concurrency} at a time, {os.cpu_count()} CPUs shared"
    )
    print(f"  connections open at the service while slow clients were held: {min(held):.0f}")
    print(f"  without slow clients: p50 {p_without[0]:.2f} ms, p99 {p_without[1]:.2f} ms")
    print(f"  with {args.slow} slow clients: p50 {p_with[0]:.2f} ms, p99 {p_with[1]:.2f} ms")
    print(
        f"  ratio with/without: p50 {p_with[0] / p_without[0]:.2f}, "
        f"p99 {p_with[1] / p_without[1]:.2f}"
    )
    print(
        f"  {len(closed)} of {args.slow} slow clients closed by the service after "
        f"{min(closed):.1f}-{max(closed):.1f} s (header timeout {args.header_timeout:g} s; "
        f"waited {waited:.1f} s); header_timeout closes counted: {header_closes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--parameters", type=int, default=2410)
    parser.add_argument("--header-timeout", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        port = free_port()
        env = dict(
            os.environ,
            FEDASYNC_REDIS__URL=server.url,
            FEDASYNC_REDIS__KEY_PREFIX=PREFIX,
            FEDASYNC_SNAPSHOT__PORT=str(port),
            FEDASYNC_HTTP__HEADER_TIMEOUT_S=str(args.header_timeout),
            FEDASYNC_LOG__LEVEL="ERROR",
        )
        service = None
        try:
            asyncio.run(commit_model(server.url, args.parameters))
            service = subprocess.Popen(
                [sys.executable, "-m", "fedasync.services.snapshot"], cwd=ROOT, env=env
            )
            asyncio.run(wait_ready(port))
            asyncio.run(bench(port, args))
        finally:
            if service is not None:
                service.terminate()
                service.wait()
            server.stop()


async def wait_ready(port: int) -> None:
    """Until the service answers /readyz with 200 (it has the model), at most 30 s."""
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError("the snapshot service did not become ready")


if __name__ == "__main__":
    main()
