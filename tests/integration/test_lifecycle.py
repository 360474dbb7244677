"""Services as real processes: SIGTERM drains and exits cleanly; publishing rides out Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.client import DeviceClient, PreparedUpdate, RetryPolicy
from fedasync.learning.tasks import get_task
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import ledger, make_update, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; killed at teardown whatever the test's outcome."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def spawn(module: str, settings: Settings, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "FEDASYNC_REDIS__URL": str(settings.redis.url),
            "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
            "FEDASYNC_TASK__NAME": "linear",
            "FEDASYNC_AGGREGATOR__BLOCK_MS": "100",
            "FEDASYNC_AGGREGATOR__PORT": "0",
            **extra,
        }
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"fedasync.services.{module}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


async def test_aggregator_drains_on_sigterm(
    settings: Settings,
    redis: aioredis.Redis,
    tmp_path: Path,
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    keys = Keys(settings.redis.key_prefix)
    process = spawn("aggregator", settings, tmp_path / "aggregator.log")
    spawned.append(process)
    size = get_task("linear").layout.size
    for i in range(20):
        update = Update(f"s{i}", "c", 0, 1, np.zeros(size, np.float32))
        await redis.xadd(keys.updates, stream_entry.build(encode_update(update)))
    await wait_for_ledger(redis, keys, "0-0", 20)  # all decided and committed (an event)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    log = (tmp_path / "aggregator.log").read_text()
    assert "draining and stopping" in log
    assert "RunResult(version=11," in log  # τ_max = 10: the rest, trained from 0, are stale
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    assert len(await ledger(redis, keys)) == 20


async def test_snapshot_service_stops_cleanly_on_sigterm(
    settings: Settings, tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    process = spawn(
        "snapshot", settings, tmp_path / "snapshot.log", FEDASYNC_SNAPSHOT__PORT=str(port)
    )
    spawned.append(process)
    # another process offers no event to await: poll /livez, with a generous deadline
    deadline = asyncio.get_running_loop().time() + 60
    async with aiohttp.ClientSession() as session:
        while True:
            assert process.poll() is None, "snapshot service exited early"
            assert asyncio.get_running_loop().time() < deadline, "not serving within 60 s"
            try:
                async with session.get(f"http://127.0.0.1:{port}/livez") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert "draining and stopping" in (tmp_path / "snapshot.log").read_text()


class RetryWatch(logging.Handler):
    """Set once the worker logs that a publish failed and will be retried: the retry path is
    known to have been taken, with no guess at how long that takes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.retried = asyncio.Event()
        self.logger = logging.getLogger("fedasync.client.transport")

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("publish failed"):
            self.retried.set()  # logged from the event loop's thread, inside publish()

    def __enter__(self) -> asyncio.Event:
        self.logger.addHandler(self)
        return self.retried

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


async def test_publish_retries_with_the_same_bytes_across_a_redis_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    settings = load_settings(redis={"url": server.url, "key_prefix": "restart"})
    client = connect(settings.redis)
    keys = Keys("restart")
    device = DeviceClient(
        "http://127.0.0.1:1", "c0", redis=client, key_prefix="restart", retry=RetryPolicy(20)
    )
    try:
        raw = encode_update(make_update("once", base=0))
        update = PreparedUpdate("once", 0, raw)
        await device.send(update)
        server.kill()  # Redis dies; the next publish meets a dead socket
        with RetryWatch() as retried:
            publishing = asyncio.create_task(device.send(update))
            await asyncio.wait_for(retried.wait(), timeout=30)  # it failed and will retry
            assert not publishing.done()
            server.start()  # same port, same AOF
            await asyncio.wait_for(publishing, timeout=30)
        entries: Any = await client.xrange(keys.updates)
        assert [stream_entry.message_of(fields) for _, fields in entries] == [
            raw,
            raw,
        ]  # the first survived the kill
    finally:
        await client.aclose()
        server.stop()
