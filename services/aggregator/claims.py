"""Taking over stream entries that another consumer of the group holds and is not deciding.

An entry read by an aggregator stays pending under its consumer name until a commit acknowledges
it. If that aggregator never commits again (killed, fenced off by a newer one, stopped with
SIGSTOP), its entries would wait for the next aggregator start. So they are claimed twice over:

- at start, every entry pending under another consumer, whatever its idle time: the aggregator
  that read it is dead or fenced off by this start (its commits are refused);
- while running, on a period, every entry idle for at least a minimum time, under any consumer,
  this one's own name included (an older aggregator of the same name may have read it after the
  takeover at start, or a read whose reply was lost may have left it there), except the entries
  of the commit in flight, which that commit acknowledges.

XPENDING (with IDLE) lists them and XCLAIM with the same min-idle-time moves them, ids only
(JUSTID, no payloads, no delivery count raised). XCLAIM re-checks the idle time atomically, so an
entry some consumer touched since the listing stays where it is. Claiming never decides anything:
the claimed entries are re-read from this consumer's pending list and decided from the committed
state like any other, and only the newest epoch's commit can acknowledge them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Set
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys

#: pending entries listed per XPENDING
PAGE = 1000


async def claim(
    redis: aioredis.Redis,
    keys: Keys,
    consumer: str,
    *,
    min_idle_ms: int,
    others_only: bool = False,
    exclude: Set[bytes] = frozenset(),
) -> Counter[str]:
    """Make pending entries idle for `min_idle_ms` or more this `consumer`'s; returns how many
    were taken from each consumer. `others_only` leaves this consumer's own entries alone;
    `exclude` names entries never to take (a commit in flight acknowledges them)."""
    taken: Counter[str] = Counter()
    start = "-"
    while True:
        pending: Any = await redis.xpending_range(
            keys.updates, AGGREGATOR_GROUP, min=start, max="+", count=PAGE, idle=min_idle_ms
        )
        owners = {
            p["message_id"]: p["consumer"].decode()
            for p in pending
            if p["message_id"] not in exclude
            and not (others_only and p["consumer"].decode() == consumer)
        }
        if owners:
            moved: Any = await redis.xclaim(
                keys.updates, AGGREGATOR_GROUP, consumer, min_idle_ms, list(owners), justid=True
            )
            taken.update(owners[entry_id] for entry_id in moved if entry_id in owners)
        if len(pending) < PAGE:
            return taken
        start = "(" + pending[-1]["message_id"].decode()


async def current_epoch(redis: aioredis.Redis, keys: Keys) -> int | None:
    """The fencing token in force (None if Redis has none: every commit would be refused)."""
    raw = await redis.get(keys.epoch)
    return None if raw is None else int(raw)
