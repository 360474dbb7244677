"""Redis's memory: how much it uses against its `maxmemory`, for a metric and the memory rule.

With `maxmemory` and `noeviction` (compose's), a full Redis refuses every write that allocates:
devices' XADDs, the aggregator's commits. The control service reads this each rules tick,
exports it (`fedasync_redis_used_memory_bytes`, `fedasync_redis_maxmemory_bytes`,
`fedasync_redis_memory_share`) and its memory rule turns `pause-ingest` on, and alerts, above
FEDASYNC_CONTROL__MEMORY_HIGH of the limit, before Redis refuses anything (docs/operations.md,
"Redis memory").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_cluster import is_cluster, on_node_of


@dataclass(frozen=True, slots=True)
class Memory:
    used: int  # bytes (INFO memory: used_memory)
    limit: int  # maxmemory in bytes; 0 = none

    @property
    def share(self) -> float:
        """used ÷ limit; 0 without a limit (nothing to warn about)."""
        return self.used / self.limit if self.limit else 0.0


async def read_memory(redis: aioredis.Redis, key: str | None = None) -> Memory:
    """One INFO memory: used_memory and maxmemory. On a Redis Cluster, of the primary of
    `key`'s slot (the run's node; INFO would otherwise go to the client's default node)."""
    if key is not None and is_cluster(redis):
        info: Any = await on_node_of(redis, key, "INFO", "memory")
    else:
        info = await redis.info("memory")
    return Memory(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))
