"""A read whose reply is lost: the entries it delivered are decided in the same epoch.

XREADGROUP `>` moves entries into the consumer's pending list when Redis runs it. If the reply
then never arrives (a socket timeout while Redis is slow, or Redis killed after its AOF fsync
and before the reply), a retried `>` read never returns those entries again: they stayed pending,
undecided, until the aggregator's next restart. The chaos harness's drain would wait for them
in vain. Here the loss is made exact: the read runs, then its reply is replaced by a timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from fedasync.services.aggregator.service import Aggregator
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import records
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import initial_state, make_update, publish, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_entries_of_a_read_whose_reply_was_lost_are_still_decided(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    read = redis.xreadgroup
    lost: list[Any] = []

    async def read_losing_first_reply(*args: Any, **kwargs: Any) -> Any:
        reply = await read(*args, **kwargs)
        if reply and reply[0][1] and not lost:
            lost.append(reply)  # Redis ran it: its entries are pending for us now
            raise RedisTimeoutError("reply lost")
        return reply

    redis.xreadgroup = read_losing_first_reply  # type: ignore[method-assign]
    stopping = asyncio.Event()
    running = asyncio.create_task(aggregator.run(stopping))
    try:
        for i in range(5):
            await publish(redis, keys, make_update(f"u{i}", base=0))
        await wait_for_ledger(redis, keys, "0-0", 5)  # times out without the re-read
    finally:
        stopping.set()
        await running
    assert lost, "no reply was lost: the test did not exercise the case"
    decided = [record["update_id"] async for record in records(redis, keys)]
    assert sorted(decided) == [f"u{i}" for i in range(5)]
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
