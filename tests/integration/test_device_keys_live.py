"""Device keys with the services as real processes: a rotation in flight, and keys at rest.

Real processes throughout: a redis-server of the test's own, the ingest service and the
aggregator as `python -m` processes, and `fedasync devices add <id>` run as the admin runs it.

Rotation (docs/operations.md, "Rotating device keys"), from an HMAC key to Ed25519 on one
client id: the device signs with its HMAC key and has updates accepted; the aggregator is
stopped, so that more are accepted and left undecided; the key is rotated. Then: every update
ingest accepted under the old key is decided (none lost, although its key is no longer the
device's); a new update signed with the old key is refused as `bad_signature`; one signed with the
new Ed25519 key is accepted and decided; the receipts route answers a read signed with the new key
and refuses one signed with the old.

At rest (issue 27, "a Redis dump holding no private key"): after `devices add` and a run signed
with the key, what Redis writes to disk (its RDB by SAVE, the RDB a replica is sent, the AOF)
holds the device's public key and not its private key, in any of the forms it could take.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import redis.asyncio as aioredis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedasync.learning.tasks import get_task
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.device_keys import HMAC, add_device
from fedasync.shared.device_auth import (
    ED25519_PREFIX,
    SigningKey,
    ed25519_texts,
    parse_key,
    parse_signing_key,
)
from fedasync.shared.ingest_protocol import PATH, read_headers, receipt_path, signed_headers
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import dead_letters, ledger, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = "phone-7"


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test started; killed at teardown whatever the test's outcome."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def environment(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env.update(
        {
            "FEDASYNC_REDIS__URL": str(settings.redis.url),
            "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
            "FEDASYNC_TASK__NAME": "linear",
            "FEDASYNC_AUTH__REQUIRED": "true",
            "FEDASYNC_AGGREGATOR__BLOCK_MS": "100",
            "FEDASYNC_AGGREGATOR__PORT": "0",
            **extra,
        }
    )
    return env


def spawn(module: str, settings: Settings, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"fedasync.services.{module}"],
            cwd=ROOT,
            env=environment(settings, **extra),
            stdout=out,
            stderr=out,
        )


def devices_add(settings: Settings, client_id: str = CLIENT, *options: str) -> str:
    """`fedasync devices add <client id>` as the operator runs it: the new key, printed once."""
    command = ["devices", "add", *options, client_id]
    done = subprocess.run(
        [sys.executable, "-m", "fedasync.services.commands.cli", *command],
        cwd=ROOT,
        env=environment(settings),
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().strip()


async def serving(url: str, process: subprocess.Popen[bytes]) -> None:
    """Poll /readyz of another process until it answers 200 (no event crosses a process)."""
    deadline = asyncio.get_running_loop().time() + 60
    async with aiohttp.ClientSession() as session:
        while True:
            assert process.poll() is None, "ingest exited early"
            assert asyncio.get_running_loop().time() < deadline, "ingest not ready within 60 s"
            try:
                async with session.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)


def now_ms() -> int:
    return int(time.time() * 1000)


async def post(
    session: aiohttp.ClientSession,
    url: str,
    key: SigningKey,
    update_id: str,
    client_id: str = CLIENT,
) -> tuple[int, dict[str, Any]]:
    weights = np.linspace(0, 1, get_task("linear").layout.size, dtype=np.float32)
    body = encode_update(Update(update_id, client_id, 0, 10, weights))
    headers = signed_headers(key, client_id, now_ms(), body)
    async with session.post(url + PATH, data=body, headers=headers) as response:
        return response.status, await response.json()


async def receipt(
    session: aiohttp.ClientSession,
    url: str,
    key: SigningKey,
    update_id: str,
    client_id: str = CLIENT,
) -> tuple[int, dict[str, Any]]:
    headers = read_headers(key, client_id, now_ms(), update_id)
    async with session.get(url + receipt_path(update_id), headers=headers) as response:
        return response.status, await response.json()


async def test_rotating_hmac_to_ed25519_with_updates_in_flight_loses_none(
    settings: Settings,
    redis: aioredis.Redis,
    tmp_path: Path,
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    keys = Keys(settings.redis.key_prefix)
    old = parse_key(await add_device(redis, keys, CLIENT, HMAC))  # the key it has had for years
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ingest = spawn(
        "ingest",
        settings,
        tmp_path / "ingest.log",
        FEDASYNC_INGEST__PORT=str(port),
        FEDASYNC_INGEST__RATE_PER_S="1000",
        FEDASYNC_INGEST__BURST="1000",
        # a cached key is trusted for a minute: the rotation is seen by ingest's script, which
        # adds an entry only while the device's stored key is the one its signature was
        # checked with (services/ingest/store.py), not by the cache's expiry
        FEDASYNC_AUTH__KEY_REFRESH_S="60",
    )
    spawned.append(ingest)
    await serving(url, ingest)
    aggregator = spawn("aggregator", settings, tmp_path / "aggregator.log")
    spawned.append(aggregator)

    async with aiohttp.ClientSession() as session:
        # before the rotation: accepted and decided under the HMAC key
        assert (await post(session, url, old, "before"))[0] == 202
        cursor = await wait_for_ledger(redis, keys, "0-0", 1)
        aggregator.send_signal(signal.SIGTERM)
        assert aggregator.wait(timeout=30) == 0
        # in flight: accepted under the HMAC key, not decided when the key changes
        for update_id in ("flight-1", "flight-2"):
            status, answer = await post(session, url, old, update_id)
            assert status == 202, answer
        assert await redis.xlen(keys.updates) == 3

        new_text = devices_add(settings)
        assert new_text.startswith("ed25519:")
        new = parse_signing_key(new_text)
        stored: Any = await redis.hget(keys.device_keys, CLIENT)
        assert (stored or b"").startswith(b"ed25519:")  # the public key only

        # after: the old key is refused with the documented reason, the new one accepted
        status, answer = await post(session, url, old, "late-old")
        assert (status, answer["reason"]) == (401, "bad_signature")
        status, answer = await post(session, url, new, "after")
        assert status == 202, answer

        aggregator = spawn("aggregator", settings, tmp_path / "aggregator.log")
        spawned.append(aggregator)
        await wait_for_ledger(redis, keys, cursor, 3)
        decided = {e["update_id"]: e["outcome"] for e in await ledger(redis, keys)}
        assert decided == {
            "before": "applied",
            "flight-1": "applied",
            "flight-2": "applied",
            "after": "applied",
        }
        assert await dead_letters(redis, keys) == []
        # ... and it is the marker that took them: their signatures no longer hold
        log = (tmp_path / "aggregator.log").read_text()
        assert log.count("its key was rotated after ingest verified it") == 2

        # receipts: read with the new key, never with the old
        for update_id in ("flight-1", "after"):
            status, answer = await receipt(session, url, new, update_id)
            assert (status, answer["outcome"]) == (200, "applied"), answer
        status, answer = await receipt(session, url, old, "after")
        assert (status, answer["reason"]) == (401, "bad_signature")
    aggregator.send_signal(signal.SIGTERM)
    assert aggregator.wait(timeout=30) == 0


def private_forms(private_text: str) -> dict[str, bytes]:
    """Every form in which the private key printed could sit in a file: the 32-byte seed raw,
    in hex, in base64 (standard, URL-safe, unpadded), and the text the device holds."""
    seed = base64.b64decode(private_text.removeprefix(ED25519_PREFIX))
    assert len(seed) == 32
    return {
        "seed": seed,
        "hex": seed.hex().encode(),
        "base64": base64.b64encode(seed).rstrip(b"="),
        "urlsafe base64": base64.urlsafe_b64encode(seed).rstrip(b"="),
        "device text": private_text.encode(),
    }


async def test_after_devices_add_and_a_run_what_redis_writes_holds_no_private_key(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        settings = load_settings(
            redis={"url": server.url, "key_prefix": "t-at-rest"}, task={"name": "linear"}
        )
        private_text = devices_add(settings, "phone-ed")  # Ed25519: the default kind
        key = parse_signing_key(private_text)
        assert isinstance(key, Ed25519PrivateKey)
        public_text = ed25519_texts(key.private_bytes_raw())[1]
        forms = private_forms(private_text)
        # a secret Redis does hold, to show that the search finds one when it is there
        hmac_text = devices_add(settings, "phone-mac", "--kind", "hmac")

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        ingest = spawn("ingest", settings, tmp_path / "ingest.log", FEDASYNC_INGEST__PORT=str(port))
        aggregator = spawn("aggregator", settings, tmp_path / "aggregator.log")
        spawned += [ingest, aggregator]
        await serving(url, ingest)
        redis = connect(settings.redis)
        try:
            keys = Keys(settings.redis.key_prefix)
            async with aiohttp.ClientSession() as session:
                for i in range(3):
                    status, answer = await post(session, url, key, f"u{i}", "phone-ed")
                    assert status == 202, answer
                await wait_for_ledger(redis, keys, "0-0", 3)
                status, answer = await receipt(session, url, key, "u2", "phone-ed")
                assert (status, answer["outcome"]) == (200, "applied"), answer
            for process in (ingest, aggregator):
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=30) == 0
            # uncompressed, so that a key cannot hide inside an LZF-compressed value
            await redis.config_set("rdbcompression", "no")
            assert await redis.save()
        finally:
            await redis.aclose()
        replica_rdb = tmp_path / "replica.rdb"  # what a replica (or `redis-cli --rdb`) is sent
        subprocess.run(
            ["redis-cli", "-p", str(server.port), "--rdb", str(replica_rdb)],
            check=True,
            capture_output=True,
        )
        aof = b"".join(p.read_bytes() for p in sorted((tmp_path / "redis").rglob("*.aof")))
        written = {
            "SAVE's dump.rdb": (tmp_path / "redis" / "dump.rdb").read_bytes(),
            "the replica's RDB": replica_rdb.read_bytes(),
            "the AOF": aof,
        }
    finally:
        server.stop()
    for where, blob in written.items():
        assert public_text.encode() in blob, where  # the dump does hold the device's key
        assert b"t-at-rest" in blob, where  # ... and the run's keys
        assert hmac_text.encode() in blob, where  # an HMAC key is its secret: stored as it is
        for form, raw in forms.items():
            assert raw not in blob, f"{where} holds the private key ({form})"
