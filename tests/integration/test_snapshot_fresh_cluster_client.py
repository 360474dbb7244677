"""The snapshot service on a cluster client that has sent nothing yet, as in a fresh process.

Its first Redis command is the SUBSCRIBE of its versions follower, and a cluster's pub/sub picks
the channel's node from the client's slot map, which only a command fills: the follower must
learn the map first (seen on the compose `cluster` profile, where the follower failed with a
KeyError for the channel's slot, again and again, and the service never became ready). Real
parts: a LocalCluster, the aggregator committing its initial model, the snapshot service over
real HTTP.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from aiohttp import ClientSession

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.runtime.redis_cluster import connect_cluster
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, start_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.asyncio]

#: how long a start may take on a loaded machine (a deadline, not a measure)
PATIENCE_S = 60.0


async def test_the_snapshot_follows_versions_on_a_cluster_client_that_sent_nothing(
    cluster_settings: Settings,
) -> None:
    settings = cluster_settings
    keys = Keys(settings.redis.key_prefix)
    stopping = asyncio.Event()
    aggregator = asyncio.create_task(
        run_aggregator(
            settings, initial=initial_state(settings), handle_signals=False, stopping=stopping
        )
    )
    watcher, fresh = connect_cluster(settings.redis), connect_cluster(settings.redis)
    snapshot: asyncio.Task[None] | None = None
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not await watcher.exists(keys.version):  # the initial model, committed
            assert time.monotonic() < deadline, "the aggregator committed no initial model"
            await asyncio.sleep(0.1)
        assert isinstance(fresh, aioredis.RedisCluster)
        assert not fresh.nodes_manager.slots_cache  # it has learnt nothing yet
        snapshot, url = await start_snapshot(settings, fresh, stopping)
        async with ClientSession() as http:
            while True:  # served once the follower subscribed and read the committed version
                async with http.get(f"{url}/v1/models/latest/meta") as response:
                    if response.status == 200:
                        meta = await response.json()
                        break
                assert time.monotonic() < deadline, f"no model served: {response.status}"
                await asyncio.sleep(0.2)
        assert meta["version"] == 0
    finally:
        stopping.set()
        await asyncio.gather(aggregator, *([snapshot] if snapshot else []))
        await fresh.aclose()
        await watcher.aclose()
