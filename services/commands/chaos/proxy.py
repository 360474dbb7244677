"""A TCP proxy between a service and Redis that can stall one chosen command.

The fault an audit injected by hand: Redis (or the network) stalls on one command for longer than
the client's socket timeout, so the client gives up on it while the rest of the system carries
on. The proxy reads the RESP requests going to Redis well enough to name each command (name,
sub-command, first key) and, when a command matches an armed `Stall`, holds that connection:

- `StallMode.REPLY`: the command reaches Redis at once and runs; its reply is held back until the
  client has given up. The write happened, the client never hears of it (a lost reply).
- `StallMode.REQUEST`: the command is held back and reaches Redis only after the stall, when the
  client has long given up and retried: a late command.

Everything else is passed through byte for byte. Used by the tests (every command a service sends,
stalled in turn) and by `fedasync chaos` (the `stall_redis` fault), which runs it on a thread of
its own (`ProxyThread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: commands whose first argument is a sub-command, named together ("XINFO GROUPS")
_CONTAINERS = frozenset({"XINFO", "XGROUP", "SCRIPT", "CLIENT", "CONFIG", "ACL", "OBJECT"})
#: commands that name no key
_KEYLESS = frozenset({"PING", "AUTH", "HELLO", "SELECT", "MULTI", "EXEC", "DISCARD", "QUIT"})
_READ_SIZE = 65536


class StallMode(StrEnum):
    REPLY = "reply"  # the command runs at once, its reply is held back: a lost reply
    REQUEST = "request"  # the command is held back and runs late, after the client gave up


@dataclass(frozen=True, slots=True)
class Command:
    """A request as the proxy names it: e.g. ("XINFO GROUPS", "{p}:updates")."""

    name: str
    key: str | None = None

    def __str__(self) -> str:
        return self.name if self.key is None else f"{self.name} {self.key}"


@dataclass(slots=True)
class Stall:
    """Hold the next `times` commands that `matches` accepts for `seconds` each."""

    matches: Callable[[Command], bool]
    seconds: float
    mode: StallMode = StallMode.REPLY
    times: int = 1
    #: the commands it held, in order
    hits: list[Command] = field(default_factory=list)
    #: set once it has held `times` commands (awaitable on the proxy's loop)
    fired: asyncio.Event = field(default_factory=asyncio.Event)


def command_of(args: list[bytes]) -> Command:
    """Name a request from its arguments (the key is kept for the commands that name one)."""
    if not args:
        return Command("")
    name = args[0].decode("ascii", "replace").upper()
    rest = args[1:]
    if name in _CONTAINERS and rest:
        name = f"{name} {rest[0].decode('ascii', 'replace').upper()}"
        rest = rest[1:] if name.startswith(("XINFO", "XGROUP")) else []
    elif name in ("XREAD", "XREADGROUP"):
        upper = [a.upper() for a in rest]
        rest = rest[upper.index(b"STREAMS") + 1 :] if b"STREAMS" in upper else []
    elif name in ("EVAL", "EVALSHA", "EVALSHA_RO", "EVAL_RO", "FCALL"):
        numkeys = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else 0
        rest = rest[2:3] if numkeys else []
    elif name in _KEYLESS:
        rest = []
    key = rest[0].decode("utf-8", "replace") if rest else None
    return Command(name, key)


def parse_request(buf: bytearray, start: int) -> tuple[list[bytes], int] | None:
    """One complete request at `start` of `buf` (its arguments, where it ends), or None.

    Clients send arrays of bulk strings; an inline command (a bare line) is accepted too.
    """
    if start >= len(buf):
        return None
    line_end = buf.find(b"\r\n", start)
    if line_end < 0:
        return None
    if buf[start] != ord("*"):
        return [bytes(a) for a in bytes(buf[start:line_end]).split()], line_end + 2
    count = int(buf[start + 1 : line_end])
    pos, args = line_end + 2, []
    for _ in range(count):
        head_end = buf.find(b"\r\n", pos)
        if head_end < 0:
            return None
        if buf[pos] != ord("$"):
            raise ValueError(f"not a bulk string at byte {pos}")
        length = int(buf[pos + 1 : head_end])
        data_end = head_end + 2 + length
        if data_end + 2 > len(buf):
            return None
        # keep a short prefix only: the proxy names commands, it never needs a payload
        args.append(bytes(buf[head_end + 2 : min(data_end, head_end + 2 + 512)]))
        pos = data_end + 2
    return args, pos


class RedisProxy:
    """Listens on 127.0.0.1:`port` (0: a free one) and forwards to Redis at `upstream`."""

    def __init__(self, upstream_host: str, upstream_port: int, *, record: bool = False) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.record = record
        #: every command passed through, in order (only with `record`)
        self.seen: list[Command] = []
        #: how many commands of each name passed through
        self.counts: Counter[str] = Counter()
        self._stalls: list[Stall] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        """Stop listening and cut every connection (clients see them closed)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()  # each pump then sees its end and returns
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._server is not None:
            await self._server.wait_closed()

    def stall(
        self,
        matches: Callable[[Command], bool] | str,
        seconds: float,
        mode: StallMode = StallMode.REPLY,
        times: int = 1,
    ) -> Stall:
        """Arm a stall; `matches` is a predicate or a command name ("EVALSHA", "XINFO GROUPS")."""
        if isinstance(matches, str):
            name = matches.upper()

            def by_name(command: Command) -> bool:
                return command.name == name

            matches = by_name
        stall = Stall(matches, seconds, mode, times)
        self._stalls.append(stall)
        return stall

    def _claim_stall(self, command: Command) -> Stall | None:
        for stall in self._stalls:
            if len(stall.hits) < stall.times and stall.matches(command):
                stall.hits.append(command)
                if len(stall.hits) >= stall.times:
                    stall.fired.set()
                    self._stalls.remove(stall)
                log.info("stalling %s for %.2f s (%s)", command, stall.seconds, stall.mode.value)
                return stall
        return None

    # ---------------------------------------------------------------------------- the pumps
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return  # Redis is down: the client sees its connection closed
            self._writers.add(up_writer)
            hold = _Hold()
            try:
                await asyncio.gather(
                    self._requests(reader, up_writer, hold),
                    self._replies(up_reader, writer, hold),
                )
            finally:
                self._writers.discard(up_writer)
                up_writer.close()
                with contextlib.suppress(OSError):
                    await up_writer.wait_closed()
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def _requests(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, hold: _Hold
    ) -> None:
        """Client → Redis, one whole request at a time, so a stall holds exactly one command."""
        buf = bytearray()
        with contextlib.suppress(OSError):
            while True:
                chunk = await reader.read(_READ_SIZE)
                if not chunk:
                    break
                buf += chunk
                start = 0
                while (parsed := parse_request(buf, start)) is not None:
                    args, end = parsed
                    command = command_of(args)
                    self.counts[command.name] += 1
                    if self.record:
                        self.seen.append(command)
                    stall = self._claim_stall(command)
                    if stall is not None and stall.mode is StallMode.REQUEST:
                        up.write(bytes(buf[:start]))  # what came before it goes on time
                        del buf[:start]
                        end -= start
                        start = 0
                        await asyncio.sleep(stall.seconds)
                    elif stall is not None:
                        hold.until(stall.seconds)
                    up.write(bytes(buf[start:end]))
                    start = end
                del buf[:start]
                await up.drain()
            # the client is gone; what it sent still reaches Redis (a command held back runs late)
            up.write_eof()

    async def _replies(
        self, up: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: _Hold
    ) -> None:
        """Redis → client, held back while a REPLY stall is on."""
        client_gone = False
        with contextlib.suppress(OSError):
            while True:
                chunk = await up.read(_READ_SIZE)
                if not chunk:
                    break
                await hold.wait()
                if client_gone:
                    continue  # keep reading, so Redis never blocks on a full socket
                try:
                    writer.write(chunk)
                    await writer.drain()
                except OSError:
                    client_gone = True
        writer.close()  # Redis closed the connection (or died): so does the client's


class _Hold:
    """A connection's replies are held until a deadline on the loop's clock."""

    def __init__(self) -> None:
        self._until = 0.0

    def until(self, seconds: float) -> None:
        self._until = max(self._until, asyncio.get_running_loop().time() + seconds)

    async def wait(self) -> None:
        delay = self._until - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)


class ProxyThread:
    """A `RedisProxy` on an event loop of its own thread, for a synchronous caller (the chaos
    harness): start it, arm stalls (whose `hits` say whether they happened), stop it."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.proxy = RedisProxy(upstream_host, upstream_port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0) -> int:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="redis-proxy", daemon=True
        )
        self._thread.start()
        return self._run(self.proxy.start(port))

    def stall(self, name: str, seconds: float, mode: StallMode) -> Stall:
        async def arm() -> Stall:
            return self.proxy.stall(name, seconds, mode)

        return self._run(arm())

    def stop(self) -> None:
        """Cut every connection and end the thread. Safe to call twice."""
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.proxy.aclose(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)
