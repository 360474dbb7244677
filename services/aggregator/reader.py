"""The aggregator's reads of the updates stream: its own pending entries first, then new ones.

After a start, a read whose reply was lost, or a takeover of idle entries, the entries pending
under this consumer are exactly those never decided: they are re-read from "0" (the backlog
cursor) before anything new (">"). A read that fills the batch's room sends the next one ahead,
its command already written, so Redis serves it while this one is decided; a read-ahead no longer
wanted is settled, and what it delivered stays pending, re-read from "0".

In durable mode what a read delivers is confirmed on the replicas before it is decided
(services/runtime/redis_conn.py, `replicated`), so a commit retried on a promoted replica finds
every entry it acknowledges pending there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.lifecycle import cancel_tasks
from fedasync.services.runtime.redis_conn import TRANSIENT, replicated, retrying, until_sent
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys

#: a stream entry as XREADGROUP gives it: its id, and its fields (None once trimmed)
Entry = tuple[bytes, dict[bytes, bytes] | None]


class Reader:
    """Where the next read starts, whether the backlog must be re-read, and the read sent ahead."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        #: cursor in our own pending entries (re-read first after a restart); None once done
        self._backlog: str | None = "0"
        #: a read of new entries failed: it may have delivered entries whose reply was lost
        self.reread_pending = False
        #: the next read, sent before the current one is decided: (its start, its reply)
        self._ahead: tuple[str, asyncio.Task[Any]] | None = None

    @property
    def in_backlog(self) -> bool:
        """Whether the next read is of our own pending entries (else of new ones)."""
        return self._backlog is not None

    @property
    def start(self) -> str:
        """Where the next read starts: the backlog cursor, or ">" for new entries."""
        return self._backlog or ">"

    def backlog_done(self) -> None:
        """Our pending entries are all decided: new ones next."""
        self._backlog = None

    def reread_backlog(self) -> None:
        """Re-read our pending entries from the start, like a restart, before anything new."""
        self.reread_pending, self._backlog = False, "0"

    async def read(
        self, start: str, filled: int, block: int | None, stopping: asyncio.Event | None
    ) -> list[Entry]:
        """Read up to the batch's room (`filled` of `batch_max` taken) from `start` (">" or our
        backlog cursor); a retried read gives up at once when `stopping` is set.

        The reply comes from the read-ahead when one was sent for this `start`; when this read
        fills its room, the next is sent before returning, so Redis serves it while the entries
        returned are decided.
        """
        cfg = self._settings.aggregator
        room = min(cfg.batch_max - filled, cfg.read_count)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == start:
            reply: Any = await ahead[1]
            if not (reply and reply[0][1]) and block is not None:
                reply = await self._xreadgroup(start, room, block, stopping)
        else:
            if ahead is not None:  # sent for another start: a re-read from "0" covers it
                await _settle(ahead[1])
            reply = await self._xreadgroup(start, room, block, stopping)
        entries: list[Entry] = reply[0][1] if reply else []
        if entries and self._backlog is not None:
            self._backlog = entries[-1][0].decode()
        if len(entries) >= room and not self.reread_pending:
            # full: more is probably waiting; sized to what the next read will have room for
            left = cfg.batch_max - filled - len(entries)
            count = min(cfg.read_count, left if left > 0 else cfg.batch_max)
            following = self.start
            self._ahead = (
                following,
                asyncio.create_task(
                    self._xreadgroup(following, count, None, stopping), name="read-ahead"
                ),
            )
            # the task writes its command now, so Redis serves it while the entries returned
            # are decided (synchronously, for a small read: a task only created would send
            # nothing before the deciding is done)
            await until_sent(self._ahead[1])
        return entries

    async def read_once(
        self, count: int, block: int | None, stopping: asyncio.Event | None
    ) -> list[Entry]:
        """One read of up to `count` entries from `start`, nothing sent ahead: the reader
        process (services/aggregator/reader_process.py) never holds more than its ring has room
        for."""
        reply: Any = await self._xreadgroup(self.start, count, block, stopping)
        entries: list[Entry] = reply[0][1] if reply else []
        if entries and self._backlog is not None:
            self._backlog = entries[-1][0].decode()
        return entries

    async def _xreadgroup(
        self, start: str, count: int, block: int | None, stopping: asyncio.Event | None
    ) -> Any:
        cfg = self._settings.aggregator

        durable = self._settings.redis.durability.replicas > 0

        async def xreadgroup(client: aioredis.Redis) -> Any:
            reply = await client.xreadgroup(
                AGGREGATOR_GROUP,
                cfg.consumer,
                {self._keys.updates: start},
                count=count,
                block=block,
            )
            if durable:
                # a write of nothing (the epoch plus 0) on this connection, so that its WAIT
                # covers every delivery before it: a re-read of pending entries ("0") writes
                # nothing itself, yet their first delivery may not have reached a replica
                await client.incrby(self._keys.epoch, 0)
            return reply

        async def read() -> Any:
            try:
                # durable mode: what a read delivers is on the replicas before it is decided, so
                # a commit retried on a promoted replica finds every entry it acknowledges
                # pending there, and carries on instead of refusing (group-lost-delivery)
                return await replicated(
                    self._redis,
                    self._settings.redis.durability,
                    xreadgroup,
                    key=self._keys.updates,
                )
            except TRANSIENT:
                # Redis may have run the read (entries now pending for us) and lost the reply
                # (a timeout, or a crash after the AOF fsync): ">" never delivers those again
                if start == ">":
                    self.reread_pending = True
                raise

        return await retrying("XREADGROUP", read, self._settings.redis, stopping)

    async def ahead_ids(self) -> frozenset[bytes]:
        """The entries the read-ahead delivered (waiting for its reply if it is still on its
        way: it is read next anyway); none if there is none, or it failed."""
        if self._ahead is None:
            return frozenset()
        task = self._ahead[1]
        await _settle(task)
        if task.cancelled() or task.exception() is not None or not task.result():
            return frozenset()
        return frozenset(entry_id for entry_id, _ in task.result()[0][1])

    async def drop_ahead(self) -> None:
        """Forget the read-ahead; what it delivered stays pending under this consumer, so the
        backlog is re-read from the start before anything new."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await _settle(ahead[1])
            self.reread_pending = True

    async def cancel_ahead(self) -> None:
        """The run ends: cancel the read-ahead (what it read stays pending: re-read at the next
        start)."""
        if self._ahead is not None:
            await cancel_tasks([self._ahead[1]])


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a read whose reply is no longer wanted, whatever it ended with: what it
    delivered stays pending under this consumer, re-read from "0" (and a Redis that is away
    fails the read that comes next)."""
    with contextlib.suppress(Exception):
        await task
