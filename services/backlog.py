"""How far behind the aggregator is: entries delivered but uncommitted, and entries unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from services.keys import AGGREGATOR_GROUP, Keys


@dataclass(frozen=True, slots=True)
class Backlog:
    length: int  # entries in the updates stream
    pending: int  # delivered to the aggregator, not yet committed
    lag: int  # not yet delivered (Redis ≥ 7; 0 when the server cannot tell)

    @property
    def waiting(self) -> int:
        return self.pending + self.lag


async def read_backlog(redis: aioredis.Redis, keys: Keys) -> Backlog:
    if not await redis.exists(keys.updates):
        return Backlog(0, 0, 0)
    pending = lag = 0
    groups: Any = await redis.xinfo_groups(keys.updates)
    for group in groups:
        if group["name"] in (AGGREGATOR_GROUP, AGGREGATOR_GROUP.encode()):
            pending, lag = int(group["pending"]), int(group.get("lag") or 0)
    return Backlog(int(await redis.xlen(keys.updates)), pending, lag)
