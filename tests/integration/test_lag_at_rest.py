"""The lag at rest is 0 after Redis and aggregator restarts, whatever Redis 7.0's counter says.

Redis 7.0 logs each XREADGROUP in its AOF as XCLAIM ... LASTID, which moves the group's
last-delivered-id and not its `entries-read`: after an AOF rewrite, more reads and a kill -9, the
restarted Redis reports every entry read since the rewrite as lag, for ever (issue 25, item 2:
`lag 71` at rest with `pending 0`). Each test first shows Redis's own figure wrong at rest (the
fault happened), then fedasync's figures right: the aggregator's metric, the control status
(read as the control user, which may not read payloads) and `read_backlog`, which the rules use.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer, server_version
from fedasync.services.control.app import create_app as create_control_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.backlog import correct_lag, read_backlog
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import OBSERVER, acl_client, wait_for_ledger
from tests.integration.test_acl import KEYS, TOKEN, publish_updates, settings_as

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: how long a wait for Redis (an AOF rewrite) or for the aggregator's figures may take, in all
DEADLINE_S = 60.0
#: updates published per round of the restart scenario, while the aggregator decides them
WAVE = 40
ROUNDS = 3


async def rewrite_aof(redis: aioredis.Redis) -> None:
    """BGREWRITEAOF, and wait (polling with a deadline: Redis offers no event) until it is done."""
    before = int((await redis.info("persistence"))["aof_rewrites"])
    await redis.bgrewriteaof()
    deadline = time.monotonic() + DEADLINE_S
    while True:  # the count goes up when the rewrite starts: done is when none is in progress
        info = await redis.info("persistence")
        if int(info["aof_rewrites"]) > before and not (
            int(info["aof_rewrite_in_progress"]) or int(info["aof_rewrite_scheduled"])
        ):
            return
        assert time.monotonic() < deadline, "the AOF rewrite did not finish"
        await asyncio.sleep(0.05)


async def group_of(redis: aioredis.Redis, keys: Keys) -> dict[str, Any]:
    """The aggregator's group as XINFO GROUPS shows it, with the stream's last generated id."""
    groups: Any = await redis.xinfo_groups(keys.updates)
    [group] = [g for g in groups if g["name"] in (AGGREGATOR_GROUP, AGGREGATOR_GROUP.encode())]
    stream: Any = await redis.xinfo_stream(keys.updates)
    return {
        "last-delivered-id": group["last-delivered-id"],
        "last-generated-id": stream["last-generated-id"],
        "pending": group["pending"],
        "lag": group["lag"],
    }


def assert_drifted(group: dict[str, Any], binary: str) -> None:
    """The fault: every entry delivered and acknowledged, yet Redis reports a lag."""
    assert group["last-delivered-id"] == group["last-generated-id"], group
    if not group["lag"] and server_version(binary) >= (7, 2):
        pytest.skip(f"Redis {server_version(binary)} keeps entries-read across restarts")
    assert group["lag"] > 0, f"Redis's lag did not drift: {group}"


async def test_a_group_that_read_everything_has_lag_0_after_a_rewrite_and_a_kill_9(
    acl_server: RedisServer,
) -> None:
    server = acl_server
    keys = KEYS
    observer = acl_client(server, OBSERVER)
    for i in range(10):
        await observer.xadd(keys.updates, stream_entry.build(f"update {i}".encode()))
    await observer.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0")
    await observer.xreadgroup(AGGREGATOR_GROUP, "a", {keys.updates: ">"}, count=4)
    await rewrite_aof(observer)
    await observer.xreadgroup(AGGREGATOR_GROUP, "a", {keys.updates: ">"}, count=100)
    await observer.aclose()
    server.restart()  # SIGKILL, then the same port, data directory and ACL file

    observer = acl_client(server, OBSERVER)
    aggregator = acl_client(server, "aggregator")
    control = acl_client(server, "control")
    try:
        drifted = await group_of(observer, keys)
        assert_drifted(drifted, server.binary)
        assert drifted["lag"] == 6  # the six read after the rewrite
        # the correction runs with the aggregator's rights and leaves the group where it is
        assert await correct_lag(aggregator, keys) == 6
        corrected = await group_of(observer, keys)
        assert corrected == drifted | {"lag": 0}
        assert (await read_backlog(control, keys)).lag == 0
        # the correction is logged like any write: a restart replays it
        for client in (observer, aggregator, control):
            await client.aclose()
        server.restart()
        observer = acl_client(server, OBSERVER)
        aggregator = acl_client(server, "aggregator")
        control = acl_client(server, "control")
        assert (await group_of(observer, keys))["lag"] == 0
        # a true lag is reported as it is, and left alone
        for i in range(3):
            await observer.xadd(keys.updates, stream_entry.build(f"late {i}".encode()))
        assert await correct_lag(aggregator, keys) == 0
        backlog = await read_backlog(control, keys)
        assert (backlog.length, backlog.pending, backlog.lag) == (13, 10, 3)
        assert (await group_of(observer, keys))["last-delivered-id"] == drifted["last-delivered-id"]
    finally:
        for client in (observer, aggregator, control):
            await client.aclose()


async def metric_lag(port: int) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    for family in text_string_to_metric_families(text):
        if family.name == "fedasync_aggregator_lag":
            return float(family.samples[0].value)
    raise AssertionError("no fedasync_aggregator_lag in /metrics")


class Aggregator:
    """The real aggregator service, in this process, as the aggregator user; restartable."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        self.started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(
            run_aggregator(
                settings, handle_signals=False, stopping=self.stopping, started=self.started
            )
        )

    async def port(self) -> int:
        return await asyncio.wait_for(asyncio.shield(self.started), DEADLINE_S)

    async def crash(self) -> None:
        """Cancelled where it is, no final commit: what it decided since is re-read next time."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def stop(self) -> None:
        self.stopping.set()
        await self.task


async def status_of(control: TestClient) -> dict[str, Any]:
    response = await control.get("/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_the_lag_at_rest_is_0_after_redis_and_aggregator_restarts_under_load(
    acl_server: RedisServer,
) -> None:
    server = acl_server
    aggregator_settings = settings_as(server, "aggregator")
    control_settings = settings_as(server, "control", control={"token": TOKEN})
    published = 0
    for _ in range(ROUNDS):
        # a new aggregator each round, deciding while the updates arrive, and an AOF rewrite
        # in the middle of the wave: what is read after it is logged without entries-read,
        # so the restarted Redis counts it as lag
        aggregator = Aggregator(aggregator_settings)
        worker = acl_client(server, "worker")
        observer = acl_client(server, OBSERVER)
        try:
            await publish_updates(worker, published, WAVE // 2, base=0)
            # read to the end, the group's entries-read is exact: the rewrite records it
            await wait_for_ledger(observer, KEYS, "0-0", published + WAVE // 2)
            await rewrite_aof(observer)
            await publish_updates(worker, published + WAVE // 2, WAVE // 2, base=0)
            published += WAVE
            await wait_for_ledger(observer, KEYS, "0-0", published)
        finally:
            await aggregator.crash()
            await worker.aclose()
            await observer.aclose()
        server.restart()  # kill -9 of Redis, and the same port, data directory and ACL file

    observer = acl_client(server, OBSERVER)
    control_redis = acl_client(server, "control")
    try:
        # at rest, nothing undelivered: Redis's own lag is wrong
        drifted = await group_of(observer, KEYS)
        assert_drifted(drifted, server.binary)
        assert drifted["pending"] == 0

        # the aggregator starts again and decides one more wave; then, at rest, every figure
        # of fedasync is 0 (polled with a deadline: the metric is refreshed once a second)
        aggregator = Aggregator(aggregator_settings)
        worker = acl_client(server, "worker")
        try:
            await publish_updates(worker, published, WAVE, base=0)
            published += WAVE
            await wait_for_ledger(observer, KEYS, "0-0", published)
            port = await aggregator.port()
            deadline = time.monotonic() + DEADLINE_S
            while (lag := await metric_lag(port)) != 0:
                assert time.monotonic() < deadline, f"the aggregator's lag stays at {lag}"
                await asyncio.sleep(0.1)
            async with TestClient(
                TestServer(create_control_app(control_settings, control_redis))
            ) as control:
                status = await status_of(control)
                assert (status["pending"], status["lag"]) == (0, 0)
                assert (await group_of(observer, KEYS))["lag"] == 0  # Redis's own, corrected
                print(
                    f"lag at rest: Redis said {drifted['lag']} before the aggregator started, "
                    f"the metric and the status say {lag:g} and {status['lag']}"
                )
                assert (await read_backlog(control_redis, KEYS)).waiting == 0  # the rules' figure
            await aggregator.stop()

            # entries nobody has read yet: a true lag, reported as it is
            await publish_updates(worker, published, 7, base=0)
            async with TestClient(
                TestServer(create_control_app(control_settings, control_redis))
            ) as control:
                status = await status_of(control)
            assert (status["pending"], status["lag"]) == (0, 7)
        finally:
            if not aggregator.task.done():
                await aggregator.crash()
            await worker.aclose()
    finally:
        await observer.aclose()
        await control_redis.aclose()
