"""One Redis client per run in the services that serve every run.

On a single Redis (or under Sentinel) every run shares the one client: a run is only a key
prefix. On a Redis Cluster each run gets its own cluster client, made on first use: redis-py's
cluster client re-learns the whole slot map after a connection error and closes all of its node
connections on CLUSTERDOWN, so a client shared by all runs would let the failover of one run's
primary stall every other run's requests. With one client each, a failover touches only the runs
on that primary.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_cluster import connect_cluster, is_cluster
from fedasync.services.runtime.settings import RedisSettings
from fedasync.shared.runs import check_run_id


class RunClients:
    """The client of each run: `shared` for all on a single Redis, one each on a cluster.

    `shared` is the service's own client (the one `serve` made); on a cluster it serves the
    default run and the registry, and the others get clients of their own from `settings`.
    """

    def __init__(self, shared: aioredis.Redis, settings: RedisSettings, default: str) -> None:
        self.shared = shared
        self.default = default
        self._settings = settings
        self._own: dict[str, aioredis.Redis] = {}

    def for_run(self, run: str) -> aioredis.Redis:
        """The client to use for `run`'s keys (nothing is sent until first use)."""
        if run == self.default or not is_cluster(self.shared):
            return self.shared
        client = self._own.get(run)
        if client is None:
            client = self._own[check_run_id(run)] = connect_cluster(self._settings)
        return client

    def forget(self, run: str) -> aioredis.Redis | None:
        """Stop keeping `run`'s own client (a retired run); the caller closes what it returns."""
        return self._own.pop(run, None)

    async def aclose(self) -> None:
        """Close the runs' own clients (the shared one is its owner's to close)."""
        owned, self._own = list(self._own.values()), {}
        for client in owned:
            await client.aclose()
