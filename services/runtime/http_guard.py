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
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fedasync.services.runtime.settings import HttpSettings

log = logging.getLogger(__name__)

#: why the guard closed a connection (the `reason` label of fedasync_http_connections_closed)
CLOSE_REASONS = ("idle", "header_timeout", "body_timeout", "send_timeout")


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

    def __init__(self, limits: HttpSettings, name: str) -> None:
        self.limits = limits
        self.name = name
        self.connections: dict[asyncio.BaseTransport, GuardedConnection] = {}
        self.refused = 0
        self.closed: Counter[str] = Counter()
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

    def close_all_timers(self) -> None:
        for connection in list(self.connections.values()):
            connection.stop_timer()


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, and the deadlines the client must keep."""

    def __init__(self, guard: Guard, inner: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._make_inner = inner
        self._inner: asyncio.Protocol | None = None
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
        assert isinstance(transport, asyncio.Transport)
        if not self._guard.admit(self, transport):
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._transport = transport
        self._inner = self._make_inner()
        self._inner.connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
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
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_timer()
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
        self.stop_timer()
        self._timer = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        """Close the connection if the client missed a deadline; else re-arm for the next one."""
        self._timer = None
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
