"""A guard in front of aiohttp's server protocol: deadlines for slow clients, a connection bound.

aiohttp's server has no deadline for a request head that never completes, none for a body that
stops arriving, and no bound on open connections: a few hundred clients that each send half a
request hold a service's sockets for as long as they like. Each accepted connection therefore
gets a `GuardedConnection`, a thin protocol wrapped around aiohttp's own, which only watches:

- waiting for a request head: it must be complete within `header_timeout_s` of its first byte
  (`header_timeout`); a new connection must start one within `header_timeout_s`, a kept-alive one
  within `idle_timeout_s` of its previous answer (`idle`): clients' pools keep connections open
  between requests (aiohttp's for up to its keep-alive default of 75 s, hence ours) and a cut
  pooled connection costs every client a failed request or a retry, while a head trickled
  byte by byte is still closed `header_timeout_s` after it began;
- while a request's body is still owed: a pause longer than `body_timeout_s` fails the body read
  with 408 Request Timeout, and the connection closes (`body_timeout`); time during which the
  server itself stopped reading (flow control: the handler has not consumed the body yet) does
  not count against the client;
- while an answer is being sent: a client that takes none of it for `body_timeout_s` is cut off
  (`send_timeout`);
- beyond `max_connections` open connections a new one is answered 503 and closed at once.

A service may also give the guard a `FastPath`: complete request heads are then first offered to
it, and the answers it has ready (bytes prepared once per version, not per request) are written
without aiohttp; the first head it declines hands the connection to aiohttp for good. A read that
is exactly a head the fast path already answered (a polling client's usual next request) is
answered from one dictionary look-up (`FastPath.known`), without buffering or splitting it. The
deadlines above apply the same way on either side.

Everything else (parsing, handlers, keep-alive, shutdown) stays aiohttp's. The guard learns where
a connection is from two hooks: the server's request factory (a head was parsed) and the
application's `on_response_prepare` signal (an answer starts). Every close is counted by reason
(`GuardCollector`, on the service's /metrics) and logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fedasync.services.runtime.http_malformed import REASONS as MALFORMED_REASONS
from fedasync.services.runtime.settings import HttpSettings

log = logging.getLogger(__name__)

#: why the guard closed a connection (the `reason` label of fedasync_http_connections_closed)
CLOSE_REASONS = ("idle", "header_timeout", "body_timeout", "send_timeout")


#: a head longer than this is never a fast-path request: aiohttp reads (and judges) it
MAX_FAST_HEAD = 8192
#: a fast answer waiting to be sent beyond this stops the reading of pipelined requests
FAST_WRITE_LIMIT = 1 << 20


class FastPath(Protocol):
    """Answers for the hottest requests, ready before they arrive (e.g. the snapshot's latest)."""

    def answer(self, head: bytes) -> Sequence[bytes] | None:
        """The answer's bytes for this complete request head (`...\r\n\r\n`), or None to leave
        the request, and every later one on its connection, to aiohttp."""
        ...

    def known(self, data: bytes) -> Sequence[bytes] | None:
        """The answer if `data` is exactly one complete head that `answer` has answered, and
        would answer the same now; else None (then the head is split out and `answer` asked):
        one dictionary look-up for the usual read, a client's whole next request."""
        ...


class BodyTimeout(web.HTTPRequestTimeout):
    """The client paused its request body for longer than allowed: answered 408, then closed."""


def _refusal(status: str, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer, written before aiohttp ever sees the connection."""
    body = json.dumps({"error": message, "reason": reason}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


_TOO_MANY = _refusal(
    "503 Service Unavailable", "connection_limit", "too many open connections; retry"
)


class Guard:
    """The guard of one service: its limits, its open connections, and what it refused."""

    def __init__(self, limits: HttpSettings, name: str, fast: FastPath | None = None) -> None:
        self.limits = limits
        self.name = name
        self.fast = fast
        self.connections: dict[asyncio.BaseTransport, GuardedConnection] = {}
        self.refused = 0
        self.closed: Counter[str] = Counter()
        #: requests aiohttp could not parse, by reason (http_malformed.py)
        self.malformed_requests: Counter[str] = Counter()
        self._full = False

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """What `loop.create_server` calls per connection: aiohttp's protocol, guarded."""
        return lambda: GuardedConnection(self, inner)

    def watch_app(self, app: web.Application) -> None:
        """Learn when `app` starts an answer (before the app is frozen)."""
        app.on_response_prepare.append(self._response_prepared)

    def watch_server(self, server: web.Server) -> None:
        """Learn when `server` has parsed a request head (its request factory is called)."""
        make_request = server.request_factory

        def request_factory(*args: Any, **kwargs: Any) -> web.BaseRequest:
            request = make_request(*args, **kwargs)
            connection = self.connections.get(request.transport)  # type: ignore[arg-type]
            if connection is not None:
                connection.request_started(request)
            return request

        server.request_factory = request_factory

    async def _response_prepared(self, request: web.Request, _: web.StreamResponse) -> None:
        connection = self.connections.get(request.transport)  # type: ignore[arg-type]
        if connection is not None:
            connection.answering()

    def admit(self, connection: GuardedConnection, transport: asyncio.BaseTransport) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            self.refused += 1
            if not self._full:
                self._full = True
                log.warning(
                    "%s: %d connections open, the limit: refusing new ones",
                    self.name,
                    len(self.connections),
                )
            return False
        self.connections[transport] = connection
        return True

    def release(self, transport: asyncio.BaseTransport) -> None:
        if self.connections.pop(transport, None) is not None and self._full:
            self._full = False
            log.info(
                "%s: below the connection limit again (%d refused so far)", self.name, self.refused
            )

    def closing(self, reason: str, peer: Any, detail: str) -> None:
        self.closed[reason] += 1
        if reason == "idle":
            log.debug("%s: closed idle connection from %s", self.name, peer)
        else:
            log.warning("%s: closed connection from %s: %s", self.name, peer, detail)

    def malformed(self, reason: str, peer: str | None) -> None:
        """A request head aiohttp could not parse, answered 400 (http_malformed.py): counted,
        and one line that names none of its bytes (they are anyone's)."""
        self.malformed_requests[reason] += 1
        log.warning("%s: malformed request from %s (%s); answered 400", self.name, peer, reason)

    def close_all_timers(self) -> None:
        for connection in list(self.connections.values()):
            connection.stop_timer()


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, and the deadlines the client must keep."""

    def __init__(self, guard: Guard, inner: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._make_inner = inner
        self._inner: asyncio.Protocol | None = None
        #: offered complete heads until it declines one; then aiohttp has the connection
        self._fast = guard.fast
        self._head = bytearray()  # bytes of the head(s) not yet answered by the fast path
        self._fast_paused = False  # reading paused: fast answers not yet taken by the client
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        #: the request being handled; None while a head is awaited (or an answer sent)
        self._request: web.BaseRequest | None = None
        self._since = self._loop.time()  # start of the current wait
        self._received = 0  # bytes since `_since` (a head begun, or not)
        self._head_began = self._since  # when the first byte of the awaited head came
        self._answered = False  # kept alive after an answer: idle_timeout_s for the next head
        self._last_received = self._since
        self._sending = (0, self._since)  # (bytes buffered to send, since when unchanged)
        #: set when a body timeout was signalled: the connection is closed by then at the latest
        self._doomed_at: float | None = None

    # --------------------------------------------------------------------- asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        transport = cast(asyncio.Transport, transport)
        if not self._guard.admit(self, transport):
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._transport = transport
        self._inner = self._make_inner()
        self._inner.connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        fast = self._fast
        if fast is not None and not self._head:
            # the usual read of a polling client: its whole next request head, a known one.
            # Nothing is buffered, so nothing of a head was awaited: answered, the connection
            # is where `_answer_fast` leaves it after an answer, the next head awaited
            transport = self._transport
            if transport is not None and not transport.is_closing():
                answer = fast.known(data)
                if answer is not None:
                    _write(transport, answer)
                    self._answered = True
                    self._since = self._last_received = self._loop.time()
                    self._pace(transport)
                    return
        now = self._loop.time()
        if self._request is None and self._received == 0 and data:
            # a head begins: from now on it has header_timeout_s, not what is left of the idle
            # allowance (the timer is moved only if that is sooner; _check re-arms it otherwise)
            self._head_began = now
            if (
                self._timer is not None
                and now + self._guard.limits.header_timeout_s < self._timer.when()
            ):
                self._arm(now + self._guard.limits.header_timeout_s)
        self._received += len(data)
        self._last_received = now
        if self._fast is not None:
            self._head += data
            self._answer_fast(now)
        elif self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_timer()
        self._fast = None
        self._head.clear()
        if self._transport is not None:
            self._guard.release(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)
        self._request = None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
        if self._fast_paused and self._transport is not None and not self._transport.is_closing():
            self._fast_paused = False
            self._transport.resume_reading()
            if self._fast is not None:
                self._answer_fast(self._loop.time())

    # ------------------------------------------------------------------------- fast path
    def _answer_fast(self, now: float) -> None:
        """Answer every complete head in the buffer from the fast path, while it has answers."""
        transport, fast = self._transport, self._fast
        while fast is not None and transport is not None and not transport.is_closing():
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_FAST_HEAD:
                    self._hand_over()
                return
            answer = fast.answer(bytes(self._head[: end + 4]))
            if answer is None:
                self._hand_over()
                return
            del self._head[: end + 4]
            _write(transport, answer)
            # answered: the next head is awaited, as after aiohttp's answers (`answering`); the
            # timer already armed fires no later than that needs, and `_check` then re-arms
            self._answered = True
            self._request = None
            self._since = now
            self._received = len(self._head)  # pipelined: the next head has begun
            if self._received:
                self._head_began = now
                self._arm(now + self._guard.limits.header_timeout_s)  # if sooner than armed
            if self._pace(transport):
                return

    def _pace(self, transport: asyncio.Transport) -> bool:
        """After a fast answer: the send deadline while it is still being sent, and reading
        paused (True) once more than FAST_WRITE_LIMIT waits for the client to take it."""
        buffered = transport.get_write_buffer_size()
        if buffered or self._timer is None:
            self._check()  # an answer still being sent has the send deadline
        if buffered > FAST_WRITE_LIMIT:
            self._fast_paused = True  # the client must take its answers first
            transport.pause_reading()
            return True
        return False

    def _hand_over(self) -> None:
        """aiohttp takes the connection (and the bytes read so far) for good."""
        self._fast = None
        data = bytes(self._head)
        self._head.clear()
        if self._inner is not None and data:
            self._inner.data_received(data)

    # ----------------------------------------------------------------------- hooks (Guard)
    def request_started(self, request: web.BaseRequest) -> None:
        """A head was parsed: from now on only a body still owed has a deadline."""
        self._request = request
        self._since = self._last_received = self._loop.time()
        self._check()

    def answering(self) -> None:
        """An answer starts: once it is sent, the next head is awaited (or, after a body
        timeout, the connection closes: aiohttp closes it once the 408 is out)."""
        if self._doomed_at is None:
            self._answered = True
            self._await_head()

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------------- deadlines
    def _await_head(self) -> None:
        self._request = None
        self._since = self._loop.time()
        self._received = 0
        self._check()

    def _arm(self, when: float) -> None:
        """Make sure `_check` runs by `when`: a timer due sooner is kept (it re-checks then and
        re-arms for what is due), so the many answers of a kept-alive connection cost no timer
        each."""
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._check()

    def _check(self) -> None:
        """Close the connection if the client missed a deadline; else re-arm for the next one."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        now = self._loop.time()
        limits = self._guard.limits
        if self._doomed_at is not None:
            if now >= self._doomed_at:
                transport.close()  # the handler never answered the 408: cut off, counted once
            else:
                self._arm(self._doomed_at)
            return
        buffered = transport.get_write_buffer_size()
        if buffered:  # an answer is being sent: the client must keep taking it
            if buffered != self._sending[0]:
                self._sending = (buffered, now)
            if now - self._sending[1] >= limits.body_timeout_s:
                # abort, not close: close() would wait for the client to take the buffer first
                self._record("send_timeout", f"took none of {buffered} bytes of its answer")
                transport.abort()
                return
            self._since = now  # the head deadline starts once the answer is out
            self._arm(self._sending[1] + limits.body_timeout_s)
            return
        request = self._request
        if request is None:
            if self._received:
                deadline = self._head_began + limits.header_timeout_s
            else:
                wait = limits.idle_timeout_s if self._answered else limits.header_timeout_s
                deadline = self._since + wait
            if now >= deadline:
                if self._received:
                    self._close("header_timeout", f"request head incomplete ({self._received} B)")
                else:
                    self._close("idle", "no request")
                return
            self._arm(deadline)
            return
        body = request.content
        if body.is_eof() or body.exception() is not None:
            return  # nothing owed by the client until the answer; `answering` re-arms
        if not transport.is_reading():  # the server paused reading: not the client's pause
            self._last_received = now
        deadline = self._last_received + limits.body_timeout_s
        if now < deadline:
            self._arm(deadline)
            return
        # the handler's read fails with 408; aiohttp answers it and, the body unread, closes
        self._record("body_timeout", f"request body paused {now - self._last_received:.1f} s")
        body.set_exception(BodyTimeout(text="the request body stopped arriving"))
        self._doomed_at = now + limits.header_timeout_s  # a backstop, should nobody read it
        self._arm(self._doomed_at)

    def _record(self, reason: str, detail: str) -> None:
        assert self._transport is not None
        self._guard.closing(reason, self._transport.get_extra_info("peername"), detail)

    def _close(self, reason: str, detail: str) -> None:
        self._record(reason, detail)
        assert self._transport is not None
        self._transport.close()


class GuardCollector(Collector):
    """The guard's counts as Prometheus metrics, for the registry of the service's /metrics."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self._guard
        yield GaugeMetricFamily(
            "fedasync_http_connections_open", "Open HTTP connections", len(guard.connections)
        )
        yield GaugeMetricFamily(
            "fedasync_http_connections_max",
            "The bound on open HTTP connections (FEDASYNC_HTTP__MAX_CONNECTIONS)",
            guard.limits.max_connections,
        )
        yield CounterMetricFamily(
            "fedasync_http_connections_refused",
            "Connections answered 503 and closed at once: the bound was reached",
            guard.refused,
        )
        closed = CounterMetricFamily(
            "fedasync_http_connections_closed",
            "Connections the guard closed, by reason: idle, header_timeout, body_timeout, "
            "send_timeout",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], guard.closed[reason])
        yield closed
        malformed = CounterMetricFamily(
            "fedasync_http_malformed_requests",
            "Requests whose head could not be parsed (answered 400 and closed), by reason: "
            + ", ".join(MALFORMED_REASONS),
            labels=["reason"],
        )
        for reason in MALFORMED_REASONS:
            malformed.add_metric([reason], guard.malformed_requests[reason])
        yield malformed


def _write(transport: asyncio.Transport, answer: Sequence[bytes]) -> None:
    """A fast answer on the wire: one write, or one writev on uvloop (head and body, no copy)."""
    if len(answer) == 1:
        transport.write(answer[0])
    else:
        transport.writelines(answer)
