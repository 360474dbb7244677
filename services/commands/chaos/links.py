"""The network between replicated Redis servers: replication that lags, and a host that dies.

On one machine a replica receives what its primary writes within microseconds, and a kill -9 of
the primary leaves whatever its kernel had already taken to be delivered, so asynchronous
replication loses next to nothing and a failover test measures little. Replicas on other hosts
lag: by the link's latency at least, more when they are busy or the link is slow. Each server
here gets an address in front of it (a `Link`), which every client, replica and Sentinel uses
instead of its port (services/commands/redis_launch/sentinel.py, `fronts`):

- what a server sends on a replication link (a connection whose peer sent REPLCONF or PSYNC) is
  delivered `lag_s` later; everything else passes at once, as for services next to the primary;
- when either end of a connection goes away, the other end is cut at once and what was still in
  flight is dropped: a host that dies takes with it what it had not delivered.

So a write acknowledged in the last `lag_s` before the primary's death is on no replica: the
window durable mode (WAIT) closes. `Links` runs every link on an event loop of its own thread,
for the synchronous harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from fedasync.services.commands.chaos.proxy import command_of, parse_request
from fedasync.services.commands.redis_launch.server import free_port

T = TypeVar("T")

_READ_SIZE = 65536
#: commands that only a replica sends: the connection carries the replication stream
_REPLICATION = frozenset({"REPLCONF", "PSYNC", "SYNC"})
#: bytes of a connection's requests read for its first commands, at most: a replica names itself
#: within its handshake's first few hundred bytes
_SNIFF_BYTES = 4096


class Link:
    """127.0.0.1:`port` → 127.0.0.1:`upstream`, replication lagging by `lag_s`."""

    def __init__(self, upstream: int, lag_s: float) -> None:
        self.upstream = upstream
        self.lag_s = lag_s
        self.port = 0
        #: replication links opened through it, so far
        self.replication_links = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, port: int | None = None) -> int:
        """Listen on `port` (by default one from `free_port`, not port 0: the kernel could give
        this link a port picked for a service of the same run that has not bound it yet)."""
        port = free_port() if port is None else port
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        pumps: list[asyncio.Task[None]] = []
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
            except OSError:
                return  # the server is down: the peer sees its connection closed
            replication = asyncio.Event()
            pumps = [
                asyncio.create_task(self._requests(reader, up_writer, replication)),
                asyncio.create_task(self._replies(up_reader, writer, replication)),
            ]
            # the first end to go away ends both: nothing still queued is delivered
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the link is closing (aclose): the connection ends like any other
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for end in (writer, up_writer):
                if end is not None:
                    end.transport.abort()
            self._tasks.discard(task)

    async def _requests(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, replication: asyncio.Event
    ) -> None:
        """Peer → server, at once; the first commands tell a replica from anything else."""
        sniffed: bytearray | None = bytearray()
        with contextlib.suppress(OSError):
            while chunk := await reader.read(_READ_SIZE):
                if sniffed is not None and len(sniffed) < _SNIFF_BYTES:
                    sniffed += chunk
                    try:
                        named = _names_replication(sniffed)
                    except ValueError:  # not RESP a replica would send: not a replica
                        named, sniffed = False, None
                    if named:
                        replication.set()
                        self.replication_links += 1
                        sniffed = None
                up.write(chunk)
                await up.drain()

    async def _replies(
        self, up: asyncio.StreamReader, writer: asyncio.StreamWriter, replication: asyncio.Event
    ) -> None:
        """Server → peer: at once, or `lag_s` late on a replication link, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(_send_late(queue, writer))
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(OSError):
                while chunk := await up.read(_READ_SIZE):
                    if replication.is_set() or not queue.empty():
                        queue.put_nowait((loop.time() + self.lag_s, chunk))
                    else:
                        writer.write(chunk)
                        await writer.drain()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender


async def _send_late(
    queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due, chunk = await queue.get()
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(chunk)
        await writer.drain()


def _names_replication(buf: bytearray) -> bool:
    """Whether the requests at the start of a connection include a replica's handshake."""
    start = 0
    while (parsed := parse_request(buf, start)) is not None:
        args, start = parsed
        if command_of(args).name.split(" ")[0] in _REPLICATION:
            return True
    return False


class Links:
    """A `Link` in front of each of several servers, on an event loop of its own thread."""

    def __init__(self, upstreams: list[int], lag_s: float) -> None:
        self.links = {port: Link(port, lag_s) for port in upstreams}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> dict[int, int]:
        """Listen in front of every server; server port → the address in front of it."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="links", daemon=True)
        self._thread.start()
        return {port: self._run(link.start()) for port, link in self.links.items()}

    @property
    def replication_links(self) -> int:
        return sum(link.replication_links for link in self.links.values())

    def stop(self) -> None:
        """Cut every connection and end the thread. Safe to call twice."""
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        for link in self.links.values():
            asyncio.run_coroutine_threadsafe(link.aclose(), loop).result(timeout=15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            raise RuntimeError("the links are not running")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)
