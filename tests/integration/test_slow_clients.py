"""Slow and hostile clients against the real services over raw sockets (issue 12, item 3).

Each HTTP service (snapshot, ingest, control, and the aggregator's metrics port; `running` also
starts the evaluator) runs as it does in production (its `run`, behind
services/runtime/http_guard.py) with small limits set here. A
head that never completes, a body that stops arriving and a client that takes none of its answer
must each be cut off: the test awaits the server's EOF with a deadline far above the configured
timeouts (it never measures how soon). Beyond the connection bound a new connection is answered
503 and closed, while the connections already open are still served.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.service import run as run_control
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.ingest.service import run as run_ingest
from fedasync.services.runtime.http_guard import log as guard_log
from fedasync.services.runtime.settings import HttpSettings, Settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.device_keys import add_device
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import PATH, signed_headers
from fedasync.shared.keys import Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import initial_state, make_update

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SERVICES = ("snapshot", "ingest", "control", "aggregator")
TOKEN = "slow-clients-test-token"
#: the limits the tests set: small, so the guard acts soon, and not so small that a stalled
#: event loop (a full GC, a starved CPU) lets them cut a well-behaved request
TIMEOUT_S = 1.0
#: how long a test waits for the server to close: far above TIMEOUT_S (it is no timing claim)
DEADLINE_S = 60.0


def configured(settings: Settings, **http: Any) -> Settings:
    limits = {"header_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S} | http
    return settings.model_copy(
        update={
            "http": HttpSettings(**limits),
            "snapshot": settings.snapshot.model_copy(update={"port": 0}),
            "ingest": settings.ingest.model_copy(update={"port": 0}),
            "control": settings.control.model_copy(update={"port": 0, "token": TOKEN}),
            # no snapshot service answers there: the evaluator serves HTTP all the same
            "evaluator": settings.evaluator.model_copy(
                update={"port": 0, "snapshot_url": "http://127.0.0.1:9", "wait_s": 1.0}
            ),
        }
    )


@asynccontextmanager
async def running(name: str, settings: Settings, redis: aioredis.Redis) -> AsyncIterator[int]:
    """Service `name` served by its own `run` until the block ends; yields its port."""
    stopping = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    options: dict[str, Any] = {"handle_signals": False, "stopping": stopping, "started": started}
    if name == "aggregator":
        service = run_aggregator(settings, redis=redis, initial=initial_state(settings), **options)
    else:
        run = {
            "snapshot": run_snapshot,
            "ingest": run_ingest,
            "control": run_control,
            "evaluator": run_evaluator,
        }[name]
        service = run(settings, redis=redis, **options)
    task: asyncio.Task[Any] = asyncio.create_task(service)
    try:
        await asyncio.wait([started, task], timeout=DEADLINE_S, return_when="FIRST_COMPLETED")
        if task.done():
            task.result()  # its error
        yield started.result()
    finally:
        stopping.set()
        await asyncio.wait_for(task, DEADLINE_S)


@pytest_asyncio.fixture(params=SERVICES)
async def service(
    request: pytest.FixtureRequest, settings: Settings, redis: aioredis.Redis
) -> AsyncIterator[tuple[str, int]]:
    async with running(request.param, configured(settings), redis) as port:
        yield request.param, port


async def open_raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (EOF)."""
    return await asyncio.wait_for(reader.read(), DEADLINE_S)


async def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def closed(figures: dict[Any, float], reason: str) -> float:
    return figures[("fedasync_http_connections_closed_total", (("reason", reason),))]


def request_head(method: str, path: str, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ------------------------------------------------------------------------------------- heads
async def test_a_request_head_that_never_completes_is_closed(service: tuple[str, int]) -> None:
    _, port = service
    reader, writer = await open_raw(port)
    idle_reader, idle_writer = await open_raw(port)
    try:
        writer.write(b"GET /livez HTTP/1.1\r\nHost: test\r\nX-Slow: ")  # and nothing more
        assert await until_closed(reader) == b""  # closed, without an answer
        assert await until_closed(idle_reader) == b""  # sent nothing at all: closed too
    finally:
        writer.close()
        idle_writer.close()
    figures = await metrics(port)
    assert closed(figures, "header_timeout") == 1
    assert closed(figures, "idle") >= 1


async def answer_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Send GET /livez on a kept-alive connection; its answer's status line."""
    writer.write(request_head("GET", "/livez"))
    status = await asyncio.wait_for(reader.readline(), DEADLINE_S)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    length = int(next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[:-2])
                      if k.lower() == b"content-length"))  # fmt: skip
    await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
    return status


@pytest.mark.parametrize("name", SERVICES)
async def test_a_kept_alive_connection_waits_for_its_next_request_past_the_head_timeout(
    name: str, settings: Settings, redis: aioredis.Redis
) -> None:
    async with running(name, configured(settings, idle_timeout_s=DEADLINE_S), redis) as port:
        reader, writer = await open_raw(port)
        try:
            assert (await answer_on(reader, writer)).startswith(b"HTTP/1.1 200")
            # a clock, not a sleep: a head opened after that answer, closed at the head timeout
            slow_reader, slow_writer = await open_raw(port)
            slow_writer.write(b"GET /livez HTTP/1.1\r\n")
            assert await until_closed(slow_reader) == b""
            slow_writer.close()
            # the kept-alive connection, idle longer than the head timeout, is still served
            assert (await answer_on(reader, writer)).startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
        figures = await metrics(port)
    assert closed(figures, "header_timeout") == 1
    assert closed(figures, "idle") == 0


async def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(
    settings: Settings, redis: aioredis.Redis
) -> None:
    async with running("snapshot", configured(settings, idle_timeout_s=TIMEOUT_S), redis) as port:
        reader, writer = await open_raw(port)
        try:
            assert (await answer_on(reader, writer)).startswith(b"HTTP/1.1 200")
            assert await until_closed(reader) == b""
        finally:
            writer.close()
        figures = await metrics(port)
    assert closed(figures, "idle") == 1


async def test_a_head_begun_after_a_long_idle_wait_still_gets_only_the_head_timeout(
    settings: Settings, redis: aioredis.Redis
) -> None:
    # idle allowance far longer than the deadline this test waits: only the head timeout,
    # counted from the head's first byte, can close the connection in time
    async with running(
        "snapshot", configured(settings, idle_timeout_s=10 * DEADLINE_S), redis
    ) as port:
        reader, writer = await open_raw(port)
        try:
            assert (await answer_on(reader, writer)).startswith(b"HTTP/1.1 200")
            writer.write(b"GET /livez HTTP/1.1\r\nX-Slow: ")  # and nothing more
            assert await until_closed(reader) == b""
        finally:
            writer.close()
        figures = await metrics(port)
    assert closed(figures, "header_timeout") == 1


# ------------------------------------------------------------------------------------ bodies
async def stalled_body(name: str, settings: Settings, redis: aioredis.Redis) -> bytes:
    """A request that declares a body and sends a little of it: each service's route that
    reads one (the snapshot and the aggregator take none: a long-poll and a GET with a body)."""
    if name == "ingest":
        keys = Keys(settings.redis.key_prefix)
        key = parse_key(await add_device(redis, keys, "slow-device"))
        body = encode_update(make_update("u-slow", 0, client="slow-device"))
        headers = signed_headers(key, "slow-device", 0, body) | {"Content-Length": str(len(body))}
        return request_head("POST", PATH, **headers) + body[:10]
    if name == "control":
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        return request_head("PATCH", "/v1/policy", **auth, **{"Content-Length": "100"}) + b"{"
    if name == "snapshot":
        path = "/v1/models/latest?newer_than=0&wait=25"
        return request_head("GET", path, **{"Content-Length": "100"}) + b"x"
    return request_head("GET", "/metrics", **{"Content-Length": "100"}) + b"x"


async def test_a_body_that_stops_arriving_is_closed(
    service: tuple[str, int], settings: Settings, redis: aioredis.Redis
) -> None:
    name, port = service
    reader, writer = await open_raw(port)
    try:
        writer.write(await stalled_body(name, settings, redis))
        answer = await until_closed(reader)
    finally:
        writer.close()
    if name == "aggregator":  # answers /metrics without the body, then closes, nothing drained
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        return
    if name != "snapshot":  # the handler was reading the body: 408, then closed
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    # the snapshot's long-poll does not read the body: the guard closes it all the same
    assert closed(await metrics(port), "body_timeout") == 1


# ------------------------------------------------------------------------------------ bound
@pytest.mark.parametrize("name", SERVICES)
async def test_beyond_the_connection_bound_a_new_connection_is_refused(
    name: str, settings: Settings, redis: aioredis.Redis
) -> None:
    # the heads of held connections must not time out meanwhile
    limits = configured(settings, max_connections=3, header_timeout_s=DEADLINE_S)
    async with running(name, limits, redis) as port:
        await refused_beyond_three(name, port)


async def refused_beyond_three(name: str, port: int) -> None:
    held = [await open_raw(port) for _ in range(3)]
    try:
        for reader, writer in held:  # each one served: it counts as open
            assert await livez(reader, writer), name
        reader, writer = await open_raw(port)
        answer = await until_closed(reader)  # the fourth: 503 and closed at once
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 "), (name, answer)
        assert b'"reason": "connection_limit"' in answer
        assert b"Retry-After: 1" in answer
        for reader, writer in held:  # those open are still served
            assert await livez(reader, writer), name
        reader, writer = held[0]
        writer.write(request_head("GET", "/metrics"))
        _, body = await response(reader)
        figures = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }
        assert figures[("fedasync_http_connections_refused_total", ())] == 1, name
        assert figures[("fedasync_http_connections_open", ())] == 3, name
    finally:
        for _, writer in held:
            writer.close()


async def response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer with a Content-Length: (head, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)


async def livez(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(request_head("GET", "/livez"))
    head, _ = await response(reader)
    return head.startswith(b"HTTP/1.1 200 ")


# ------------------------------------------------------------------------------------ answers
@contextmanager
def logged(match: Callable[[str], bool]) -> Iterator[asyncio.Event]:
    """An event set when the guard logs a line that `match`es (what the test awaits)."""
    event = asyncio.Event()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if match(record.getMessage()):
                event.set()

    handler = Handler()
    guard_log.addHandler(handler)
    try:
        yield event
    finally:
        guard_log.removeHandler(handler)


async def drain(reader: asyncio.StreamReader) -> None:
    while await asyncio.wait_for(reader.read(1 << 20), DEADLINE_S):
        pass


async def test_a_client_that_takes_none_of_its_answers_is_cut_off(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A slow reader: it pipelines requests and reads nothing, until the answers fill every
    buffer on the way; then nothing moves for the timeout and the guard closes the connection."""
    async with running("snapshot", configured(settings), redis) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            with logged(lambda line: "took none of" in line) as cut_off:
                writer.write(request_head("GET", "/metrics") * 5000)  # megabytes of answers
                await asyncio.wait_for(cut_off.wait(), DEADLINE_S)
            with pytest.raises(ConnectionResetError):  # aborted: what it never took is dropped
                await drain(reader)
        finally:
            writer.transport.abort()  # whatever happened, the service's writes end here
        assert closed(await metrics(port), "send_timeout") == 1


async def test_a_path_no_route_serves_and_a_wrong_method_are_answered_as_json(
    service: tuple[str, int],
) -> None:
    """Every error is JSON (`error`, `reason`), also those aiohttp raises before any handler:
    a device with a wrong base URL reads why, not aiohttp's plain text."""
    _, port = service
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/no/such/path") as response:
            assert response.status == 404
            body = await response.json()
        assert body["reason"] == "not_found"
        assert "/no/such/path" in body["error"]
        async with session.delete(f"http://127.0.0.1:{port}/livez") as response:
            assert response.status == 405
            assert "GET" in response.headers["Allow"]
            body = await response.json()
        assert body["reason"] == "method_not_allowed"
