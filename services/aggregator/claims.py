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

So no acknowledged entry waits more than `AggregatorSettings.decision_bound_s` (claim_idle_s +
claim_interval_s + one batch) after its read for its decision, whatever another aggregator does
(docs/architecture.md). The periodic claim first checks the epoch: a fenced-off aggregator with
nothing to commit would otherwise never hear of it, and go on reading, and stranding, entries.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Set
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Fenced
from fedasync.services.runtime.redis_conn import retrying
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys

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


class IdleClaims:
    """The running aggregator's periodic claim: when it is due, and what it took."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._due = 0.0  # time.monotonic() of the next claim

    def due(self) -> bool:
        """Whether the next `take` will claim (not merely return at once)."""
        return time.monotonic() >= self._due

    def block_ms(self) -> int:
        """How long a blocking read may wait: never past the next claim (and BLOCK 0 is for
        ever, so at least 1 ms)."""
        until_claim = (self._due - time.monotonic()) * 1000
        return max(1, min(self._settings.aggregator.block_ms, math.ceil(until_claim)))

    async def take(
        self, epoch: int, exclude: Set[bytes], stopping: asyncio.Event | None
    ) -> Counter[str]:
        """If due: raise `Fenced` if `epoch` is no longer the newest, else take over every entry
        idle for `claim_idle_s` but those in `exclude` (the commit in flight's)."""
        cfg = self._settings.aggregator
        now = time.monotonic()
        if now < self._due:
            return Counter()
        self._due = now + cfg.claim_interval_s
        newest = await retrying(
            "GET epoch",
            lambda: current_epoch(self._redis, self._keys),
            self._settings.redis,
            stopping,
        )
        if newest != epoch:
            raise Fenced(f"aggregator epoch {epoch} was fenced off by epoch {newest}")
        return await retrying(
            "claim idle entries",
            lambda: claim(
                self._redis,
                self._keys,
                cfg.consumer,
                min_idle_ms=round(cfg.claim_idle_s * 1000),
                exclude=exclude,
            ),
            self._settings.redis,
            stopping,
        )
