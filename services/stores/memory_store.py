"""The memory mode's per-client deltas in Redis (`{p}:memory`): what the commit writes, read back.

The checkpoint (`{p}:state`) leaves the deltas out and says which clients have one; the commit
script writes only the deltas its batch changed (services/aggregator/commit.py). A restore reads
them all back (services/aggregator/inspection.py), and `ledger verify` compares them with the
deltas its replay arrived at.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from fedasync.services.stores.committed import memory_from
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.keys import Keys


async def read_memory(redis: aioredis.Redis, keys: Keys) -> dict[str, bytes]:
    """Every remembered delta, client id → float32 bytes (empty outside the memory mode)."""
    return memory_from(await redis.hgetall(keys.memory))


def remembered(state: AggregationState) -> dict[str, bytes]:
    """The deltas a state remembers, as the commit writes them."""
    return {
        client: entry.delta.tobytes()
        for client, entry in state.clients.items()
        if entry.delta is not None
    }
