"""The aggregator's reader against a real Redis: its own pending entries first, the next read
sent ahead of a full one, and a dropped read-ahead's entries re-read from "0"."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.reader import Entry, Reader
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def reader_of(
    settings: Settings, redis: aioredis.Redis, updates: int
) -> tuple[Reader, Keys, list[bytes]]:
    """A reader taking two entries a read, of a stream holding `updates` entries."""
    settings = settings.model_copy(
        update={"aggregator": settings.aggregator.model_copy(update={"read_count": 2})}
    )
    keys = Keys(settings.redis.key_prefix)
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
    published = [await publish(redis, keys, make_update(f"r{i}", 0)) for i in range(updates)]
    return Reader(redis, keys, settings), keys, published


def ids(entries: list[Entry]) -> list[bytes]:
    return [entry_id for entry_id, _ in entries]


async def test_a_full_read_sends_the_next_ahead_and_a_dropped_one_is_re_read_from_0(
    settings: Settings, redis: aioredis.Redis
) -> None:
    reader, keys, published = await reader_of(settings, redis, 5)

    assert (reader.start, reader.in_backlog) == ("0", True)  # a start re-reads its own first
    assert await reader.read(reader.start, 0, None, None) == []
    reader.backlog_done()
    assert (reader.start, reader.in_backlog) == (">", False)

    assert ids(await reader.read(">", 0, None, None)) == published[:2]
    # full: the next read was sent before this one returned, and delivered the next two
    assert await reader.ahead_ids() == frozenset(published[2:4])
    assert ids(await reader.read(">", 2, None, None)) == published[2:4]

    await reader.drop_ahead()  # the third read-ahead (the fifth entry) is no longer wanted
    assert reader.reread_pending
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 5  # what it delivered stays pending under this consumer

    reader.reread_backlog()
    assert (reader.start, reader.in_backlog, reader.reread_pending) == ("0", True, False)
    again: list[Entry] = []
    while entries := await reader.read(reader.start, len(again), None, None):
        again += entries
    assert ids(again) == published


async def test_a_read_ahead_sent_for_another_start_is_settled_not_used(
    settings: Settings, redis: aioredis.Redis
) -> None:
    reader, _, published = await reader_of(settings, redis, 4)
    reader.backlog_done()

    assert ids(await reader.read(">", 0, None, None)) == published[:2]  # and two sent ahead
    # a takeover asks for the backlog: the read-ahead (of new entries) is not its reply
    reader.reread_backlog()
    assert ids(await reader.read(reader.start, 0, None, None)) == published[:2]
    assert ids(await reader.read(reader.start, 2, None, None)) == published[2:4]
    await reader.cancel_ahead()
