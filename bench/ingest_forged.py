"""Forged bodies against the ingest service: its memory, and a genuine device's updates meanwhile.

Issue 25: anyone who knows a client id could make ingest hold up to 64 MiB per connection before
the MAC was checked (six concurrent forged 60 MiB bodies took it from 73 to 486 MiB). This runs
the real services as child processes (a private redis-server, the aggregator with a linear model
of `--parameters` float32 weights, the ingest service with its default settings, as in
production: configured only through FEDASYNC_ variables), then for `--seconds`:

- `--forgers` connections (6) each send forged bodies of `--forged-mib` (60) claiming known client
  ids (`device-1…`, each its own), one after the other: the head with a MAC that is not the
  device's, then the body as fast as ingest takes it; `declared` mode sends a Content-Length,
  `chunked` mode none (a chunked upload);
- one genuine device (`device-0`) publishes a valid signed update of the model every 0.25 s,
  honouring `Retry-After` on a 503 or 429, as the device client does.

Ingest's resident memory is read from /proc (VmRSS sampled every 2 ms, and VmHWM, the kernel's
own peak, reset before the load), before the load (after a warm-up of genuine updates), at its
peak, and one second after. The acceptance of issue 25: the peak exceeds the figure before by
less than 2 × the model's update size + 16 MiB, and the genuine device's updates are accepted.

To measure an older checkout, run that checkout's own copy of this script from it (modules it
imports have moved since: issue 26); the commit printed is the imported code's.

Run: python bench/ingest_forged.py [--parameters 1000000] [--seconds 10] [--forgers 6]
                                   [--forged-mib 60] [--mode declared chunked]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import redis.asyncio as aioredis
from machine import machine

import fedasync
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings, settings_env
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor
from fedasync.services.stores.device_keys import add_device
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import CLIENT_HEADER, CONTENT_TYPE, PATH, signed_headers
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update

HOST = "127.0.0.1"
MIB = 2**20
GENUINE = "device-0"
#: seconds between two updates of the genuine device
GENUINE_EVERY_S = 0.25
#: updates the genuine device sends before anything is measured
WARMUP_UPDATES = 5
#: bytes a forger writes at once
WRITE_BYTES = MIB


class Memory:
    """A process's resident memory from /proc: sampled in a thread, and the kernel's peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def field(self, name: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
        raise LookupError(name)

    def rss(self) -> int:
        return self.field("VmRSS")

    def start_peak(self) -> None:
        """Forget the peaks so far (VmHWM reset through clear_refs) and sample from now on."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self.peak_sampled = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop_peak(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(self.peak_sampled, self.field("VmHWM"))

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            with contextlib.suppress(OSError, LookupError):
                self.peak_sampled = max(self.peak_sampled, self.rss())


@dataclass
class Tally:
    forged_sent: int = 0
    forged_answers: Counter[str] = field(default_factory=Counter)
    genuine_sent: int = 0
    genuine_accepted: int = 0
    genuine_answers: Counter[str] = field(default_factory=Counter)


async def forge(port: int, client_id: str, size: int, chunked: bool, tally: Tally) -> None:
    """One forged body: a MAC that is not the device's, as much of the body as ingest takes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nContent-Type: {CONTENT_TYPE}\r\n"
        f"{CLIENT_HEADER}: {client_id}\r\nX-Fedasync-Time: {int(time.time() * 1000)}\r\n"
        f"X-Fedasync-Signature: {'ab' * 32}\r\n"
    )
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {size}\r\n"
    tally.forged_sent += 1
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))  # an early answer stops it
    block = bytes(WRITE_BYTES)
    try:
        writer.write(head.encode() + b"\r\n")
        sent = 0
        while sent < size and not answer.done():
            piece = block[: min(WRITE_BYTES, size - sent)]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            sent += len(piece)
        if chunked and not answer.done():
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # ingest closed the connection: its answer may be there all the same
    try:
        head_bytes = await asyncio.wait_for(answer, 30)
        tally.forged_answers[head_bytes.split(b" ", 2)[1].decode()] += 1
    except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError):
        tally.forged_answers["closed unanswered"] += 1
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def forger(
    port: int, client_id: str, size: int, chunked: bool, until: float, tally: Tally
) -> None:
    while time.monotonic() < until:
        await forge(port, client_id, size, chunked, tally)


class Genuine:
    """The device `device-0`: valid signed updates of the model, one after the other."""

    def __init__(self, url: str, key: bytes, parameters: int) -> None:
        self.url = url
        self.key = key
        self.weights = np.full(parameters, 0.5, np.float32)
        self.count = 0

    def body(self) -> bytes:
        self.count += 1
        update = Update(f"genuine-{self.count}", GENUINE, 0, 10, self.weights, time.time())
        return encode_update(update)

    async def publish(self, session: aiohttp.ClientSession, tally: Tally | None) -> None:
        """One update, retried after Retry-After on a 503 or 429, until it is answered."""
        body = self.body()
        if tally is not None:
            tally.genuine_sent += 1
        while True:
            headers = signed_headers(self.key, GENUINE, int(time.time() * 1000), body)
            async with session.post(self.url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
                retry = float(response.headers.get("Retry-After", "1"))
            if tally is not None:
                tally.genuine_answers[str(status)] += 1
            if status == 202:
                if tally is not None:
                    tally.genuine_accepted += 1
                return
            if status not in (429, 503):
                return
            await asyncio.sleep(retry)

    async def run(self, session: aiohttp.ClientSession, until: float, tally: Tally) -> None:
        while time.monotonic() < until:
            started = time.monotonic()
            await self.publish(session, tally)
            await asyncio.sleep(max(0.0, GENUINE_EVERY_S - (time.monotonic() - started)))


async def body_limit(session: aiohttp.ClientSession, base: str, settings: Settings) -> str:
    """The body limit ingest works with: its gauge, where it has one (else the setting)."""
    async with session.get(base + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("fedasync_ingest_body_limit_bytes "):
            return f"{float(line.split()[1]):,.0f} bytes (from the run's model)"
    return f"{settings.ingest.max_body_bytes:,} bytes (FEDASYNC_INGEST__MAX_BODY_BYTES)"


async def measure(
    args: argparse.Namespace, settings: Settings, port: int, pid: int, key: bytes
) -> bool:
    base = f"http://{HOST}:{port}"
    genuine = Genuine(base + PATH, key, args.parameters)
    update_bytes = len(genuine.body())
    bound = 2 * update_bytes + 16 * MIB
    memory = Memory(pid)
    ok = True
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(WARMUP_UPDATES):
            await genuine.publish(session, None)
        print(machine(), flush=True)
        print(
            f"model: linear, {args.parameters:,} float32 parameters; an update is "
            f"{update_bytes:,} bytes ({update_bytes / MIB:.2f} MiB)"
        )
        print(f"body limit: {await body_limit(session, base, settings)}")
        for mode in args.mode:
            tally = Tally()
            await asyncio.sleep(1.0)
            before = memory.rss()
            memory.start_peak()
            until = time.monotonic() + args.seconds
            size = args.forged_mib * MIB
            forgers = [
                forger(port, f"device-{i + 1}", size, mode == "chunked", until, tally)
                for i in range(args.forgers)
            ]
            await asyncio.gather(genuine.run(session, until, tally), *forgers)
            peak = memory.stop_peak()
            await asyncio.sleep(1.0)
            after = memory.rss()
            rise = peak - before
            passed = rise < bound and tally.genuine_accepted > 0
            ok = ok and passed
            print(
                f"load ({mode}): {args.forgers} connections sending forged {args.forged_mib} MiB "
                f"bodies ({'chunked' if mode == 'chunked' else 'Content-Length declared'}) "
                f"for {args.seconds:g} s: {tally.forged_sent} sent, answers "
                f"{dict(sorted(tally.forged_answers.items()))}"
            )
            print(
                f"  ingest RSS: before {before / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB, after "
                f"{after / MIB:.1f} MiB; rise {rise / MIB:.1f} MiB, bound 2 x update + 16 MiB "
                f"= {bound / MIB:.1f} MiB: {'within' if rise < bound else 'OVER'}"
            )
            print(
                f"  genuine device: {tally.genuine_sent} updates sent, "
                f"{tally.genuine_accepted} accepted (202); answers "
                f"{dict(sorted(tally.genuine_answers.items()))}"
            )
    print("PASS" if ok else "FAIL")
    return ok


async def add_devices(settings: Settings, count: int) -> bytes:
    """Keys for device-0 … device-<count>; device-0's, the genuine one's, is returned."""
    redis: aioredis.Redis = connect(settings.redis)
    try:
        keys = Keys(settings.redis.key_prefix)
        genuine = await add_device(redis, keys, GENUINE)
        for i in range(count):
            await add_device(redis, keys, f"device-{i + 1}")
        return parse_key(genuine)
    finally:
        await redis.aclose()


async def wait_for_model(settings: Settings, timeout: float = 60.0) -> None:
    redis: aioredis.Redis = connect(settings.redis)
    try:
        deadline = time.monotonic() + timeout
        while await redis.get(Keys(settings.redis.key_prefix).version) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the aggregator committed no model")
            await asyncio.sleep(0.1)
    finally:
        await redis.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parameters", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--forgers", type=int, default=6)
    parser.add_argument("--forged-mib", type=int, default=60)
    parser.add_argument(
        "--mode", nargs="+", choices=("declared", "chunked"), default=["declared", "chunked"]
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fedasync-forged-"))
    server = RedisServer(work / "redis")
    server.start()
    try:
        ports = {"aggregator": free_port(), "ingest": free_port()}
        settings = load_settings(
            redis={"url": server.url, "key_prefix": "forged"},
            task={"name": "linear", "params": {"dim": args.parameters, "samples": 2}},
            aggregator={"port": ports["aggregator"]},
            ingest={"port": ports["ingest"]},
        )
        key = asyncio.run(add_devices(settings, args.forgers))
        env = settings_env(settings)
        cwd = Path(fedasync.__file__).resolve().parents[1]
        with Supervisor(work / "logs", cwd=cwd) as supervisor:
            for name in ("aggregator", "ingest"):
                ready = f"http://{HOST}:{ports[name]}/readyz"
                supervisor.start(ServiceSpec(name, f"fedasync.services.{name}", env, ready))
                supervisor.wait_ready(name, timeout=120)
            asyncio.run(wait_for_model(settings))
            pid = supervisor.children["ingest"].pid
            ok = asyncio.run(measure(args, settings, ports["ingest"], pid, key))
    finally:
        server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
