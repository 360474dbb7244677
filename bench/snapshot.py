"""Snapshot service requests per second against nginx serving the same bytes, side by side.

A model is committed to a private redis-server; the snapshot service (a real process) serves it
from memory, and nginx serves the identical bytes from a file. wrk drives both with the same
connections, on the 200 path (full download) and the 304 path (If-None-Match with the current
ETag). Ratios above 1 mean the snapshot service is faster. nginx and wrk come from Debian's
packages; the script installs them with apt-get if they are missing.

Run: python bench/snapshot.py [--parameters 2410 100000] [--connections 16] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.runtime.redis_conn import connect, get_bytes
from fedasync.services.runtime.redis_server import RedisServer, free_port
from fedasync.services.runtime.settings import load_settings
from fedasync.services.stores.keys import Keys
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.layout import Layout

ROOT = Path(__file__).resolve().parents[1]

NGINX_CONF = """
worker_processes {workers};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
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
    }}
}}
"""


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


def bench(parameters: int, connections: int, seconds: int, server: RedisServer, tmp: Path) -> None:
    prefix = f"bench-snap-{parameters}"
    body = asyncio.run(commit_model(server.url, prefix, parameters))
    (tmp / "latest.msgpack").write_bytes(body)
    ours_port, nginx_port = free_port(), free_port()
    env = dict(
        os.environ,
        FEDASYNC_REDIS__URL=server.url,
        FEDASYNC_REDIS__KEY_PREFIX=prefix,
        FEDASYNC_SNAPSHOT__PORT=str(ours_port),
        FEDASYNC_LOG__LEVEL="WARNING",
    )
    ours = subprocess.Popen([sys.executable, "-m", "fedasync.services.snapshot"], cwd=ROOT, env=env)
    results: dict[str, dict[str, float]] = {}
    try:
        ours_url = f"http://127.0.0.1:{ours_port}/v1/models/latest"
        for _ in range(200):
            try:
                urllib.request.urlopen(ours_url)
                break
            except OSError:
                time.sleep(0.05)
        for workers in (1, 2):
            conf = tmp / f"nginx-{workers}.conf"
            conf.write_text(NGINX_CONF.format(workers=workers, dir=tmp, port=nginx_port))
            nginx = subprocess.Popen(["nginx", "-c", str(conf)])
            try:
                nginx_url = f"http://127.0.0.1:{nginx_port}/v1/models/latest"
                for _ in range(200):
                    try:
                        urllib.request.urlopen(nginx_url)
                        break
                    except OSError:
                        time.sleep(0.05)
                results[f"nginx x{workers}"] = {
                    "200": wrk(nginx_url, connections, seconds),
                    "304": wrk(nginx_url, connections, seconds, etag_of(nginx_url)),
                }
            finally:
                nginx.terminate()
                nginx.wait()
        results["ours"] = {
            "200": wrk(ours_url, connections, seconds),
            "304": wrk(ours_url, connections, seconds, etag_of(ours_url)),
        }
    finally:
        ours.terminate()
        ours.wait()
    print(f"model of {parameters} parameters ({len(body)} bytes), {connections} connections")
    for path in ("200", "304"):
        line = f"  {path}: ours {results['ours'][path]:>8.0f} req/s"
        for name in ("nginx x1", "nginx x2"):
            ratio = results["ours"][path] / results[name][path]
            line += f" | {name} {results[name][path]:>8.0f} req/s, ours/{name} {ratio:.2f}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parameters", type=int, nargs="+", default=[2410, 100_000])
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    ensure_tools()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # nginx workers run unprivileged and must read the file
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            for parameters in args.parameters:
                www = Path(tmp) / f"www-{parameters}"
                www.mkdir(mode=0o755)
                bench(parameters, args.connections, args.seconds, server, www)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
