"""Hearing of a failover from the Sentinels, and trusting the replaced primary no more.

redis-py's Sentinel pool asks the Sentinels where the primary is only when it opens a
connection. A connection already open to a primary that froze (a paused VM, a long stall, a
partition) stays open through the failover; when the old primary comes back it answers on it,
as a primary in its own eyes, until the Sentinels demote it seconds later, and whatever it took
meanwhile is discarded at its demotion. Two rules close that window, for every service at once
(services/runtime/redis_conn.py builds every client of the primary with them):

- `PrimaryWatch`: the pool subscribes to `+switch-master` on every Sentinel (one task per
  Sentinel, so one cut off or paused itself misses nothing the others hear) and, on a switch of
  its primary, closes each of its connections to any other address at once, idle or in use. A
  command waiting on one fails as a lost connection does (a transient error): the caller
  repeats it, and the pool asks the Sentinels again, so it lands on the new primary.
- `is_primary`: a new connection asks the server its role (HELLO, which every user may send)
  and is refused unless it is a primary, so a reconnection never trusts a server the Sentinels
  still named a moment ago but which has been demoted since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from itertools import chain
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import RedisError

from fedasync.services.runtime.sentinel_channels import SWITCH_MASTER

log = logging.getLogger(__name__)

#: the Sentinels' announcement of a failover: `<name> <old ip> <old port> <new ip> <new port>`
SWITCH_CHANNEL = SWITCH_MASTER
#: how long one wait for a message lasts before the watcher looks again, seconds (below every
#: socket timeout, so a quiet subscription is never taken for a dead one)
LISTEN_S = 0.5
#: pause before subscribing again to a Sentinel that went away, seconds
RESUBSCRIBE_S = 1.0


def switch_of(message: bytes | str, master_name: str) -> tuple[str, int] | None:
    """The new primary's (host, port) if `message` announces a switch of `master_name`."""
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split()
    if len(parts) != 5 or parts[0] != master_name or not parts[4].isdigit():
        return None
    return parts[3], int(parts[4])


class PrimaryWatch:
    """The `+switch-master` subscriptions of one pool of connections to the primary."""

    def __init__(self, pool: SentinelConnectionPool) -> None:
        self._pool = pool
        #: one listener per Sentinel, by the Sentinel's place in the pool's list
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set by `aclose`: a closed client's late command (during a shutdown) subscribes to
        #: nothing again, so no listener outlives the client
        self._closed = False
        #: switches heard that closed connections (a figure for tests and logs)
        self.switches = 0

    @property
    def closed(self) -> bool:
        """The client closed: the listeners end, and none starts again."""
        return self._closed

    @property
    def listening(self) -> int:
        """Listeners running now (one per Sentinel while the client is open)."""
        return sum(not task.done() for task in self._tasks.values())

    def ensure_started(self) -> None:
        """Subscribe on every Sentinel, once per event loop (called as the pool hands out a
        connection, so a client nobody uses subscribes to nothing)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new loop (or the first): the old one's tasks died with it
            self._loop, self._tasks = loop, {}
        sentinels: Sequence[aioredis.Redis] = self._pool.sentinel_manager.sentinels
        for i, sentinel in enumerate(sentinels):
            task = self._tasks.get(i)
            if task is not None and not task.done():
                continue
            if task is not None and not task.cancelled() and task.exception() is not None:
                # a listener ends only on what it does not expect: said, then started again
                log.warning("the %s listener %d ended: %r", SWITCH_CHANNEL, i, task.exception())
            self._tasks[i] = loop.create_task(self._listen(sentinel), name=f"primary-watch-{i}")

    async def aclose(self) -> None:
        """Stop listening for good (the client closes)."""
        self._closed = True
        tasks, self._tasks = list(self._tasks.values()), {}
        if self._loop is not asyncio.get_running_loop():
            return  # another loop's tasks: gone with it
        # A cancel that lands as get_message's own timeout fires can be taken for that timeout
        # and lost (asyncio.timeout on Python 3.11): awaiting the task then never ends (seen in
        # CI: a test hung 300 s in aclose). So the listeners also end on `_closed`, within
        # LISTEN_S, and each one still running is cancelled again until it is done.
        pending = set(tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=2 * LISTEN_S)
        for task in tasks:  # each ending retrieved, so none is reported as never retrieved
            error = None if task.cancelled() else task.exception()
            if error is not None and not isinstance(error, RedisError | OSError):
                log.warning("the %s listener ended: %r", SWITCH_CHANNEL, error)

    async def _listen(self, sentinel: aioredis.Redis) -> None:
        while not self.closed:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                while not self.closed:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=LISTEN_S
                    )
                    if message is not None and message.get("type") == "message":
                        await self._heard(message["data"])
            except (RedisError, OSError) as exc:
                log.debug("no %s subscription on a Sentinel for now (%s)", SWITCH_CHANNEL, exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            if not self._closed:
                await asyncio.sleep(RESUBSCRIBE_S)

    async def _heard(self, message: bytes | str) -> None:
        pool = self._pool
        new = switch_of(message, pool.service_name)
        if new is None:
            return
        pool.master_address = new
        stale = [
            c
            for c in chain(pool._available_connections, pool._in_use_connections)
            if c.is_connected and _address(c) != new
        ]
        if not stale:
            return
        self.switches += 1
        log.warning(
            "the Sentinels switched the primary %s to %s:%s: closing %d connection(s) to the "
            "old one; commands in flight there fail and are repeated on the new primary",
            pool.service_name,
            *new,
            len(stale),
        )
        await asyncio.gather(*(c.disconnect(nowait=True) for c in stale), return_exceptions=True)


def _address(connection: AbstractConnection) -> tuple[str, int]:
    host: Any = getattr(connection, "host", None)
    port: Any = getattr(connection, "port", None)
    return str(host), int(port or 0)


def hello_role(reply: Any) -> str | None:
    """The `role` of a HELLO reply (RESP2: a flat list of names and values), as text."""
    if not isinstance(reply, list):
        return None
    fields = [v.decode() if isinstance(v, bytes) else v for v in reply]
    for name, value in zip(fields[::2], fields[1::2], strict=False):
        if name == "role":
            return str(value)
    return None
