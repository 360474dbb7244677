"""The deciding process's side of the reader process: its ring, its start, its restarts.

Process mode (`aggregator.reader = "process"`, docs/plans/issue-29-reader.md): the aggregator
makes a ring (services/aggregator/ring.py) sized from the model's layout, spawns the reader
(services/aggregator/reader_process.py) and takes prepared entries out of the ring, in stream
order, copying each out of its slot and releasing the slot at once. An entry too large for a
slot arrives as a spill: fetched here (XRANGE of its id) and prepared by the decider's own
preparer, so it is decided in its place in the order.

Restarts: the reader's death (kill -9, a crash) is seen once the ring is drained (its process
sentinel); `restart_needed` then asks the aggregator's loop to commit what it decided and start
a new reader (`restart`). A new reader reads our pending entries from "0": with the commit
landed, those are exactly the undecided ones, so nothing is decided twice or skipped. The same
restart serves a takeover of idle entries (their ids may be lower than those published). The
old reader is killed and joined before the new ring is made, so two never write at once.

The reader dies with this process: it holds the read end of a pipe whose write end only this
process holds (`_parent_w`), and at EOF it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from typing import Any

import msgpack
import redis.asyncio as aioredis

from fedasync.services.aggregator import reader_process
from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.preparing import THREAD_DECIDE_BYTES, Prepared, Preparer, Ready
from fedasync.services.aggregator.reader_process import Spill
from fedasync.services.aggregator.ring import Ring, drain, wake
from fedasync.services.runtime.redis_conn import retrying
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import Keys

#: the ring holds at most this many bytes (a 10M-parameter model gets a few slots, not 64)
RING_BYTES = 256 * 1024 * 1024


class ProcessFeed:
    """Prepared entries from the reader process, in stream order."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        keys: Keys,
        preparer: Preparer,
        archiving: bool,
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._keys = keys
        self._preparer = preparer
        self._archiving = archiving
        self._ring: Ring | None = None
        self._process: Any = None
        self._data_r = self._space_w = self._parent_w = -1
        self._conns: list[Any] = []
        #: the reader is gone (or a re-read from "0" is wanted): commit, then `restart`
        self.restart_needed = False
        #: reader processes started so far (tests and logs)
        self.started = 0

    @property
    def pid(self) -> int | None:
        return None if self._process is None else int(self._process.pid)

    # ------------------------------------------------------------------------------ life
    def start(self, size: int) -> None:
        """A ring for `size`-parameter models and a reader on it, reading from "0"."""
        cfg = self._settings.aggregator
        slot = reader_process.slot_bytes(self._settings, size, self._archiving)
        slots = max(2, min(cfg.ring_slots, RING_BYTES // slot))
        self._size = size
        self._ring = ring = Ring.create(slots, slot)
        ctx = multiprocessing.get_context("spawn")
        data_r, data_w = ctx.Pipe(duplex=False)
        space_r, space_w = ctx.Pipe(duplex=False)
        parent_r, parent_w = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=reader_process.main,
            args=(
                self._settings,
                ring.name,
                (data_w, space_r, parent_r),
                self._archiving,
                os.getpid(),
            ),
            name="fedasync-reader",
            daemon=True,
        )
        self._process.start()
        for theirs in (data_w, space_r, parent_r):  # the child has its own copies now
            theirs.close()
        self._conns = [data_r, space_w, parent_w]
        self._data_r, self._space_w, self._parent_w = (c.fileno() for c in self._conns)
        for fd in (self._data_r, self._space_w):
            os.set_blocking(fd, False)
        self.restart_needed = False
        self.started += 1
        log.info(
            "reader process %d started: ring of %d slots of %d bytes",
            self._process.pid,
            slots,
            slot,
        )

    async def stop(self) -> None:
        """Kill the reader and join it, then drop the ring: what it held stays pending in the
        group, re-read by the next reader."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            await asyncio.to_thread(process.join)
            process.close()
        for conn in self._conns:
            conn.close()
        self._conns = []
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    async def restart(self) -> None:
        """A new reader on a new ring (call once the commit in flight landed)."""
        await self.stop()
        self.start(self._size)

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def held_ids(self) -> frozenset[bytes]:
        """The entries published and not yet taken (never claimed from under the reader)."""
        ring = self._ring
        if ring is None:
            return frozenset()
        out = set()
        for offset in range(ring.pending()):
            item = ring.peek_at(ring.tail + offset)
            if item is not None:
                fields = msgpack.unpackb(item)
                if len(fields) > 1:
                    out.add(fields[1])
        return frozenset(out)

    # ------------------------------------------------------------------------------ taking
    async def take(
        self,
        room: int,
        wait_s: float | None,
        stopping: asyncio.Event | None,
        *,
        until_caught_up: bool,
    ) -> tuple[list[Prepared], bool]:
        """Up to `room` prepared entries, and whether to decide them in a worker thread.

        Waits up to `wait_s` (None: for as long as it takes) for the first; none when the wait
        ran out, `stopping` was set, the reader is gone (`restart_needed`), or, with
        `until_caught_up`, the reader's last read found nothing new (what an empty
        non-blocking read tells the one-process loop).
        """
        ring = self._ring
        assert ring is not None
        deadline = None if wait_s is None else time.monotonic() + wait_s
        items: list[Prepared | Spill] = []
        while True:
            drain(self._data_r)
            self._take_ready(ring, room, items)
            if items:
                break
            if not self.alive():
                if ring.pending() == 0:
                    self.restart_needed = True
                    return [], False
                continue
            if until_caught_up and ring.mark == ring.head + 1:
                return [], False
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or (stopping is not None and stopping.is_set()):
                return [], False
            await self._wait(left, stopping)
        prepared = await self._unspill(items, stopping)
        size = sum(p.update.weights.nbytes for p in prepared if isinstance(p, Ready))
        return prepared, size >= THREAD_DECIDE_BYTES

    def _take_ready(self, ring: Ring, room: int, items: list[Prepared | Spill]) -> None:
        """Move what the ring holds into `items` (at most `room`), each copied out of its slot
        and the slot released at once."""
        while len(items) < room:
            got = ring.peek()
            if got is None:
                return
            meta, body = got
            items.append(reader_process.decode(meta, body))
            body.release()
            ring.release()
            if ring.waiting:
                wake(self._space_w)

    async def _wait(self, seconds: float | None, stopping: asyncio.Event | None) -> None:
        """Until the reader rings, exits, `stopping` is set or `seconds` pass."""
        loop = asyncio.get_running_loop()
        rung: asyncio.Future[None] = loop.create_future()

        def ring() -> None:
            if not rung.done():
                rung.set_result(None)

        sentinel = self._process.sentinel
        loop.add_reader(self._data_r, ring)
        loop.add_reader(sentinel, ring)
        waits: set[asyncio.Future[Any]] = {rung}
        stop_task = None
        if stopping is not None:
            stop_task = asyncio.ensure_future(stopping.wait())
            waits.add(stop_task)
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(self._data_r)
            loop.remove_reader(sentinel)
            if stop_task is not None:
                stop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stop_task

    async def _unspill(
        self, items: list[Prepared | Spill], stopping: asyncio.Event | None
    ) -> list[Prepared]:
        """Spilled entries fetched from the stream and prepared here, each in its place."""
        out: list[Prepared] = []
        for item in items:
            if not isinstance(item, Spill):
                out.append(item)
                continue
            stream_id = item.stream_id

            async def fetch(sid: bytes = stream_id) -> Any:
                return await self._redis.xrange(self._keys.updates, sid, sid)

            found: Any = await retrying(
                "XRANGE spilled entry", fetch, self._settings.redis, stopping
            )
            entries = list(found) if found else [(stream_id, None)]
            prepared, _ = await self._preparer.prepare(entries, stopping)
            out.extend(prepared)
        return out
