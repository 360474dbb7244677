"""The evaluator across a lost reply: one evaluation record per version, not two.

Its XADD of a record ran, the reply was lost (a socket timeout); the loop backed off and, still
believing the version unrecorded, fetched, scored and recorded it again. The fault proxy
(services/commands/chaos/proxy.py) holds back the reply of that one XADD.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer

from fedasync.learning.tasks import get_task
from fedasync.services.commands.chaos.proxy import Command, RedisProxy, StallMode
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.runtime.own_run import own_run
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations
from fedasync.shared.keys import Keys
from fedasync.shared.snapshot_protocol import MODEL_CONTENT_TYPE, VERSION_HEADER, latest_path
from tests.integration.test_evaluator import model_bytes

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEADLINE_S = 60.0
VERSION = 3


class OneVersion:
    """A snapshot service holding one version; it says what each long-poll asked for."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked: list[int] = []
        self.changed = asyncio.Condition()
        self.closing = asyncio.Event()

    async def latest(self, request: web.Request) -> web.Response:
        than = int(request.query["newer_than"])
        async with self.changed:
            self.asked.append(than)
            self.changed.notify_all()
        if than >= VERSION:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), float(request.query["wait"]))
            return web.Response(status=204)
        headers = {VERSION_HEADER: str(VERSION)}
        return web.Response(body=self.body, content_type=MODEL_CONTENT_TYPE, headers=headers)

    async def asked_times(self, count: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.asked) >= count)


@pytest_asyncio.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[RedisProxy]:
    started = RedisProxy("127.0.0.1", redis_server.port)
    await started.start()
    try:
        yield started
    finally:
        await started.aclose()


async def test_a_record_whose_reply_was_lost_is_not_recorded_again(
    settings: Settings, redis: aioredis.Redis, proxy: RedisProxy
) -> None:
    keys = Keys(settings.redis.key_prefix)
    snapshots = OneVersion(model_bytes(VERSION, get_task("linear").layout.size))
    app = web.Application()
    app.router.add_get(latest_path(own_run(settings)), snapshots.latest)

    def record_xadd(command: Command) -> bool:
        return command.name == "XADD" and command.key == keys.evaluations

    stall = proxy.stall(record_xadd, 1.5, StallMode.REPLY)
    stopping = asyncio.Event()
    async with TestServer(app) as server:
        cfg = settings.model_copy(
            update={
                "redis": settings.redis.model_copy(
                    update={"url": proxy.url, "socket_timeout_s": 0.5}
                ),
                "evaluator": settings.evaluator.model_copy(
                    update={
                        "snapshot_url": str(server.make_url("")).rstrip("/"),
                        "port": 0,
                        "wait_s": 1.0,
                    }
                ),
            }
        )
        client = connect(cfg.redis)
        evaluator = asyncio.create_task(
            run_evaluator(cfg, redis=client, handle_signals=False, stopping=stopping)
        )
        try:
            await asyncio.wait_for(stall.fired.wait(), DEADLINE_S)  # the record's reply is lost
            # two more long-polls: whatever the retry did, it did before the third one
            await asyncio.wait_for(snapshots.asked_times(3), DEADLINE_S)
        finally:
            snapshots.closing.set()
            stopping.set()
            await evaluator
            await client.aclose()
    assert snapshots.asked[:3] == [-1, VERSION, VERSION]  # not -1 again: it knew it had recorded
    assert [r.version for r in await evaluations.all_records(redis, keys)] == [VERSION]
