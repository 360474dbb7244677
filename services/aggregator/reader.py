"""Reads of the updates stream on a thread of their own, with their own client and event loop.

A read of 32 updates at 1M parameters is 128 MB: the aggregator's event loop would spend most of
its time taking such replies off the socket and parsing them, and deciding (numpy, which releases
the GIL) would wait for it, or it for deciding. Here the reads run on a second event loop in a
thread, so the next read is on its way, taken off the socket and parsed while the current one is
decided: the two overlap on two cores. Nothing else moves: the reads are the same coroutines
(`redis_conn.replicated` in durable mode, the same failover-aware client from `connect`), retried
by the aggregator's own loop, and what a read delivered stays pending in Redis until a commit
acknowledges it, whichever thread read it.

A read is submitted at once (`submit`), not when the caller's loop next runs a task: the caller
decides synchronously right after sending the read-ahead, and a task created then would not
even send its command before the deciding is done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import RedisSettings

T = TypeVar("T")

#: how long closing waits for the reader's client to close before leaving the thread behind
CLOSE_TIMEOUT_S = 5.0


class ReadThread:
    """One thread, one event loop, one Redis client: the aggregator's stream reads."""

    def __init__(self, settings: RedisSettings) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name="fedasync-stream-reader", daemon=True
        )
        self._thread.start()
        #: used only on the reader's loop (a client's connections belong to the loop that made
        #: them); nothing is sent until the first read
        self.client = connect(settings)

    def submit(
        self, read: Callable[[aioredis.Redis], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        """Start `read(client)` on the reader's loop now; its result, or its error, comes back
        through the future (cancelling the future cancels the read)."""
        return asyncio.run_coroutine_threadsafe(self._run(read), self._loop)

    async def run(self, read: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """`submit`, awaited from the caller's loop."""
        return await asyncio.wrap_future(self.submit(read))

    async def _run(self, read: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        return await read(self.client)

    def _serve(self) -> None:
        """The thread: the loop until `close` stops it, then the loop closed here, by its own
        thread, once nothing runs on it any more."""
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def close(self) -> None:
        """Close the client and end the thread; reads still running are cancelled first, and
        waited for, so each connection they held is released or dropped before the client
        closes (a connection left to the garbage collector after its loop ended warns)."""
        if not self._thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(closing), CLOSE_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, CLOSE_TIMEOUT_S)

    async def _close(self) -> None:
        running = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.client.aclose()
