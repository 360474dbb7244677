"""Snapshot service requests per second against nginx serving the same bytes, side by side.

A model is committed to a private redis-server; the snapshot service (a real process, started as
`fedasync up` and compose start it) serves it from memory, and nginx serves the identical bytes
from files: the model at `/v1/models/latest`, and the JSON our service answers at
`/v1/models/latest/meta` at the same path. wrk drives each with the same connections, threads and
duration, on three paths: 200 (full download), 304 (If-None-Match with the server's current ETag)
and meta. Each side runs with 1 and with 2 processes (`--workers`: FEDASYNC_SNAPSHOT__WORKERS for
ours, worker_processes for nginx). All servers run side by side and the runs alternate (per
round, per path, every server in turn, `--rounds` times; ours and nginx with as many processes
next to each other, which goes first alternating from round to round), so a load that comes and
goes on a shared machine touches all alike. A ratio is ours ÷ nginx with as many processes, above
1 the snapshot service is faster: each round gives one, of two runs seconds apart, and a cell is
the median of its rounds' ratios with their range (min-max) in brackets, the req/s figures
likewise. On a 2-core machine shared with other work the rounds' ratios spread widely (wrk, both
servers and the other work share the cores): many short rounds keep the median stable, hence the
defaults. The commit, nproc and the load average are printed first, and each model's load after.
nginx and wrk come from Debian's packages; the script installs them with apt-get if missing.

Run: python bench/snapshot.py [--parameters 10000 100000 1000000] [--connections 16] [--seconds 2]
     [--rounds 9] [--workers 1 2] [--paths 200 304 meta]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from machine import machine

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect, get_bytes
from fedasync.services.runtime.settings import load_settings
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.keys import Keys
from fedasync.shared.layout import Layout

ROOT = Path(__file__).resolve().parents[1]

NGINX_CONF = """
worker_processes {workers};
daemon off;
pid {dir}/nginx-{workers}.pid;
error_log {dir}/error-{workers}.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/models/latest {{
            default_type application/vnd.fedasync.model+msgpack;
            alias {dir}/latest.msgpack;
        }}
        location = /v1/models/latest/meta {{
            default_type application/json;
            alias {dir}/meta.json;
        }}
    }}
}}
"""
PATHS = ("200", "304", "meta")


def ensure_tools() -> None:
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing and Path("/usr/sbin/nginx").exists():
        missing = [m for m in missing if m != "nginx"]
    if missing:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx-light", "wrk"], check=True)


def wrk(url: str, connections: int, seconds: int, etag: str | None = None) -> float:
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", url]
    if etag:
        command[1:1] = ["-H", f"If-None-Match: {etag}"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if match is None or non_2xx is not None:
        raise RuntimeError(f"wrk failed:\n{out}")
    return float(match.group(1))


def etag_of(url: str) -> str:
    with urllib.request.urlopen(url) as response:
        return str(response.headers["ETag"])


async def commit_model(url: str, prefix: str, parameters: int) -> bytes:
    settings = load_settings(redis={"url": url, "key_prefix": prefix})
    redis = connect(settings.redis)
    try:
        weights = np.random.default_rng(0).standard_normal(parameters).astype(np.float32)
        state = AggregationState(weights, Layout.flat(parameters))
        await run_aggregator(settings, redis=redis, initial=state, handle_signals=False, burst=True)
        raw = await get_bytes(redis, Keys(prefix).model(0))
        assert raw is not None
        return raw
    finally:
        await redis.aclose()


def wait_up(url: str) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(url)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def bench(
    parameters: int,
    connections: int,
    seconds: int,
    rounds: int,
    workers: list[int],
    paths: list[str],
    server: RedisServer,
    tmp: Path,
) -> None:
    prefix = f"bench-snap-{parameters}"
    body = asyncio.run(commit_model(server.url, prefix, parameters))
    (tmp / "latest.msgpack").write_bytes(body)
    servers = [f"{who} x{n}" for n in workers for who in ("ours", "nginx")]
    ports = {name: free_port() for name in servers}
    base = {name: f"http://127.0.0.1:{port}/v1/models/latest" for name, port in ports.items()}
    processes = []
    results: dict[str, dict[str, list[float]]] = {n: {p: [] for p in paths} for n in servers}
    try:
        for n in workers:
            env = dict(
                os.environ,
                FEDASYNC_REDIS__URL=server.url,
                FEDASYNC_REDIS__KEY_PREFIX=prefix,
                FEDASYNC_SNAPSHOT__PORT=str(ports[f"ours x{n}"]),
                FEDASYNC_SNAPSHOT__WORKERS=str(n),
                FEDASYNC_LOG__LEVEL="WARNING",
            )
            command = [sys.executable, "-m", "fedasync.services.snapshot"]
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env))
            wait_up(base[f"ours x{n}"])
        with urllib.request.urlopen(base[servers[0]] + "/meta") as response:
            (tmp / "meta.json").write_bytes(response.read())  # the same bytes for nginx
        for n in workers:
            name = f"nginx x{n}"
            conf = tmp / f"nginx-{n}.conf"
            conf.write_text(NGINX_CONF.format(workers=n, dir=tmp, port=ports[name]))
            processes.append(subprocess.Popen(["nginx", "-c", str(conf)]))
            wait_up(base[name])
        for round_ in range(rounds):
            for path in paths:
                for name in servers if round_ % 2 == 0 else servers[::-1]:
                    url = base[name] + ("/meta" if path == "meta" else "")
                    etag = etag_of(url) if path == "304" else None
                    results[name][path].append(wrk(url, connections, seconds, etag))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
    print(
        f"model of {parameters} parameters ({len(body)} bytes), {connections} connections, "
        f"{rounds} alternating rounds of {seconds} s, load average {os.getloadavg()[0]:.2f}"
    )
    for path in paths:
        line = f"  {path:>4}:"
        for n in workers:
            ours, nginx = results[f"ours x{n}"][path], results[f"nginx x{n}"][path]
            # each round's ratio is of two runs next to each other in time: the spread of those
            # says how stable the comparison is, whatever the load did between rounds
            ratios = [o / g for o, g in zip(ours, nginx, strict=True)]
            line += (
                f" | x{n}: ours {statistics.median(ours):>7.0f} ({min(ours):.0f}-{max(ours):.0f}),"
                f" nginx {statistics.median(nginx):>7.0f} ({min(nginx):.0f}-{max(nginx):.0f})"
                f" req/s, {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parameters", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    args = parser.parse_args()
    ensure_tools()
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # nginx workers run unprivileged and must read the file
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            for parameters in args.parameters:
                www = Path(tmp) / f"www-{parameters}"
                www.mkdir(mode=0o755)
                bench(
                    parameters,
                    args.connections,
                    args.seconds,
                    args.rounds,
                    args.workers,
                    args.paths,
                    server,
                    www,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
