"""The ingest service: the real aiohttp app against a real Redis.

Refusals by reason (status, typed JSON, counter, nothing added to the stream), the body cap before
reading, idempotent retries (also concurrent ones), the rate limit, and health endpoints.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import tracemalloc
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.app import create_app as create_control_app
from fedasync.services.ingest import app as ingest_app
from fedasync.services.ingest.app import INGEST, create_app
from fedasync.services.ingest.openapi import spec
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import add_device, revoke_device
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import (
    CONTENT_TYPE,
    PATH,
    read_headers,
    receipt_path,
    signed_headers,
)
from fedasync.shared.keys import Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import ingest_refusals as refusals
from tests.integration.helpers import initial_state, make_update

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LIMIT = 4096


def ingest_settings(settings: Settings, **ingest: Any) -> Settings:
    section = settings.ingest.model_copy(
        update={"max_body_bytes": LIMIT, "rate_per_s": 1000.0, "burst": 1000} | ingest
    )
    return settings.model_copy(update={"ingest": section})


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest_asyncio.fixture
async def device_key(settings: Settings, redis: aioredis.Redis) -> bytes:
    return parse_key(await add_device(redis, Keys(settings.redis.key_prefix), "dev-a"))


async def start(settings: Settings, redis: aioredis.Redis) -> TestClient[Any, Any]:
    client = TestClient(TestServer(create_app(settings, redis)))
    await client.start_server()
    return client


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient[Any, Any]]:
    client = await start(ingest_settings(settings), redis)
    try:
        yield client
    finally:
        await client.close()


async def stream_length(redis: aioredis.Redis, settings: Settings) -> int:
    return int(await redis.xlen(Keys(settings.redis.key_prefix).updates))


def body_of(update_id: str, client: str = "dev-a") -> bytes:
    return encode_update(make_update(update_id, 0, client=client))


async def test_a_signed_update_is_added_with_server_built_fields(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    body = body_of("u1")
    headers = signed_headers(device_key, "dev-a", now_ms(), body)
    response = await client.post(PATH, data=body, headers=headers)
    answer = await response.json()
    assert response.status == 202
    assert answer["update_id"] == "u1"
    assert answer["retry"] is False
    entries: Any = await redis.xrange(Keys(settings.redis.key_prefix).updates)
    assert len(entries) == 1
    entry_id, fields = entries[0]
    assert entry_id.decode() == answer["entry_id"]
    # the entry's fields as docs/wire-format.md spells them (shared/stream_entry.py owns them)
    assert fields == {
        b"m": body,
        b"c": b"dev-a",
        b"t": headers["X-Fedasync-Time"].encode(),
        b"s": headers["X-Fedasync-Signature"].encode(),
    }


async def test_refusals_carry_status_reason_and_are_counted(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    revoked_key = parse_key(await add_device(redis, keys, "dev-r"))
    await revoke_device(redis, keys, "dev-r")
    body = body_of("u1")
    good = signed_headers(device_key, "dev-a", now_ms(), body)
    wrong_client = body_of("u2", client="dev-b")
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("unsupported_media_type", body, good | {"Content-Type": "application/json"}, 415),
        ("unsigned", body, {"Content-Type": CONTENT_TYPE}, 401),
        ("malformed_signature", body, good | {"X-Fedasync-Time": "later"}, 401),
        ("unknown_device", body, signed_headers(device_key, "dev-x", now_ms(), body), 401),
        ("revoked", body, signed_headers(revoked_key, "dev-r", now_ms(), body), 401),
        ("bad_signature", body, signed_headers(bytes(32), "dev-a", now_ms(), body), 401),
        (
            "signature_expired",
            body,
            signed_headers(device_key, "dev-a", now_ms() - 3_600_000, body),
            401,
        ),
        ("malformed", b"\xc1", signed_headers(device_key, "dev-a", now_ms(), b"\xc1"), 422),
        (
            "client_mismatch",
            wrong_client,
            signed_headers(device_key, "dev-a", now_ms(), wrong_client),
            403,
        ),
    ]
    for reason, data, headers, status in cases:
        response = await client.post(PATH, data=data, headers=headers)
        answer = await response.json()
        assert (response.status, answer["reason"]) == (status, reason)
        assert answer["error"]
        assert refusals(client, reason) == 1.0
        if reason == "malformed_signature":  # the header at fault is named, not a field letter
            assert "t: X-Fedasync-Time" in answer["error"], answer
        if reason == "signature_expired":  # a time in seconds is the usual mistake
            assert "milliseconds since the Unix epoch" in answer["error"], answer
    assert await stream_length(redis, settings) == 0


async def test_an_oversized_content_length_is_refused_before_the_body_is_sent(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis
) -> None:
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {10**12}\r\n\r\n".encode()
        )
        await writer.drain()
        # not one byte of the body has been sent: the answer comes anyway, then the server
        # closes the connection instead of waiting for (or reading) the terabyte announced
        reply = await reader.read()
    finally:
        writer.close()
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert json.loads(payload)["reason"] == "too_large"
    assert refusals(client, "too_large") == 1.0
    assert await stream_length(redis, settings) == 0


async def test_a_gzip_bomb_is_refused_unread_and_never_inflated(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    """Issue 12: a 61 KB body inflated to 60 MiB before its 401. A compressed body is refused
    (415) before a byte of it is read, whoever signed it, and nothing is ever inflated."""
    inflated = 64 * 2**20
    bomb = gzip.compress(bytes(inflated), compresslevel=9)  # about 64 KB on the wire
    headers = signed_headers(device_key, "dev-a", now_ms(), bomb) | {"Content-Encoding": "gzip"}
    # the head alone, the body never sent: the refusal comes anyway, then the connection closes
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        head = f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nContent-Length: {len(bomb)}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(head.encode() + b"\r\n")
        reply = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    status, _, payload = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 415 ")
    assert json.loads(payload)["reason"] == "content_encoding"
    # the whole bomb sent: refused the same way, and the memory this process allocated while
    # it was handled stays a small multiple of what was sent, never near what it inflates to
    tracemalloc.start()
    try:
        response = await client.post(PATH, data=bomb, headers=headers)
        answer = await response.json()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (response.status, answer["reason"]) == (415, "content_encoding")
    assert peak < 16 * len(bomb) < inflated // 8, peak
    assert refusals(client, "content_encoding") == 2.0
    assert await stream_length(redis, settings) == 0


async def test_expect_100_continue_is_refused_before_continue(
    client: TestClient[Any, Any],
) -> None:
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Expect: 100-continue\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
        )
        await writer.drain()
        reply = await reader.read()
    finally:
        writer.close()
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"100 Continue" not in reply


async def test_a_chunked_body_over_the_limit_is_cut_off_while_reading(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    body = bytes(LIMIT + 1000)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    headers = signed_headers(device_key, "dev-a", now_ms(), body)
    response = await client.post(PATH, data=chunks(), headers=headers)
    assert response.status == 413
    assert (await response.json())["reason"] == "too_large"
    assert await stream_length(redis, settings) == 0


async def test_the_size_of_an_accepted_chunked_body_is_observed(
    client: TestClient[Any, Any], device_key: bytes
) -> None:
    """A chunked upload has no Content-Length: the histogram gets the size of the body read."""
    body = body_of("u-chunked")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        for start in range(0, len(body), 100):
            yield body[start : start + 100]

    headers = signed_headers(device_key, "dev-a", now_ms(), body)
    response = await client.post(PATH, data=chunks(), headers=headers)
    assert response.status == 202
    registry = client.app[INGEST].metrics.registry
    assert registry.get_sample_value("fedasync_ingest_body_bytes_count") == 1
    assert registry.get_sample_value("fedasync_ingest_body_bytes_sum") == len(body)


async def test_a_retry_with_the_same_update_id_is_one_entry(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    body = body_of("retried")
    answers = []
    for _ in range(2):  # signed afresh each time, as the worker does
        response = await client.post(
            PATH, data=body, headers=signed_headers(device_key, "dev-a", now_ms(), body)
        )
        assert response.status == 202
        answers.append(await response.json())
    assert answers[0]["entry_id"] == answers[1]["entry_id"]
    assert [a["retry"] for a in answers] == [False, True]
    assert await stream_length(redis, settings) == 1


async def test_concurrent_retries_add_one_entry(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    body = body_of("concurrent")
    headers = signed_headers(device_key, "dev-a", now_ms(), body)
    responses = await asyncio.gather(
        *(client.post(PATH, data=body, headers=headers) for _ in range(8))
    )
    answers = [await r.json() for r in responses]
    assert [r.status for r in responses] == [202] * 8
    assert len({a["entry_id"] for a in answers}) == 1
    assert sorted(a["retry"] for a in answers) == [False] + [True] * 7
    assert await stream_length(redis, settings) == 1


async def test_the_same_update_id_with_other_content_is_a_conflict(
    client: TestClient[Any, Any], device_key: bytes, settings: Settings, redis: aioredis.Redis
) -> None:
    first = encode_update(make_update("reused", 0, 1.0, client="dev-a"))
    other = encode_update(make_update("reused", 0, 2.0, client="dev-a"))
    for body, status in ((first, 202), (other, 409)):
        response = await client.post(
            PATH, data=body, headers=signed_headers(device_key, "dev-a", now_ms(), body)
        )
        assert response.status == status
    assert (await response.json())["reason"] == "update_id_reused"
    assert await stream_length(redis, settings) == 1


async def test_a_device_over_its_rate_gets_429_with_retry_after(
    settings: Settings, redis: aioredis.Redis, device_key: bytes
) -> None:
    client = await start(ingest_settings(settings, rate_per_s=0.01, burst=2), redis)
    try:
        statuses = []
        for i in range(3):
            body = body_of(f"r{i}")
            response = await client.post(
                PATH, data=body, headers=signed_headers(device_key, "dev-a", now_ms(), body)
            )
            statuses.append(response.status)
        assert statuses == [202, 202, 429]
        assert (await response.json())["reason"] == "rate_limited"
        assert int(response.headers["Retry-After"]) >= 1
        assert refusals(client, "rate_limited") == 1.0
        assert await stream_length(redis, settings) == 2
    finally:
        await client.close()


async def test_forged_requests_do_not_use_up_a_devices_tokens(
    settings: Settings, redis: aioredis.Redis, device_key: bytes
) -> None:
    client = await start(ingest_settings(settings, rate_per_s=0.01, burst=1), redis)
    try:
        body = body_of("mine")
        for _ in range(5):
            forged = signed_headers(bytes(32), "dev-a", now_ms(), body)
            assert (await client.post(PATH, data=body, headers=forged)).status == 401
        genuine = signed_headers(device_key, "dev-a", now_ms(), body)
        assert (await client.post(PATH, data=body, headers=genuine)).status == 202
    finally:
        await client.close()


async def test_health_and_metrics_endpoints(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/livez")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert (
        await client.post(PATH, data=b"x", headers={"Content-Type": CONTENT_TYPE})
    ).status == 401
    metrics = await (await client.get("/metrics")).text()
    assert 'fedasync_ingest_refusals_total{reason="unsigned"} 1.0' in metrics


async def test_the_pause_ingest_switch_answers_503_until_it_is_turned_off(
    settings: Settings, redis: aioredis.Redis, device_key: bytes
) -> None:
    token = "pause-ingest-test-token"
    auth = {"Authorization": f"Bearer {token}"}
    operators = settings.model_copy(
        update={"control": settings.control.model_copy(update={"token": token})}
    )
    await run_aggregator(  # installs the policy, as a running system has one
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    control = TestClient(TestServer(create_control_app(operators, redis, run_rules=False)))
    await control.start_server()
    ingest = await start(ingest_settings(settings, policy_refresh_s=0.0), redis)
    try:
        flipped = await control.post(
            "/v1/switches/pause-ingest", json={"on": True, "reason": "flood"}, headers=auth
        )
        assert flipped.status == 200
        body = body_of("p1")
        paused = await ingest.post(
            PATH, data=body, headers=signed_headers(device_key, "dev-a", now_ms(), body)
        )
        assert paused.status == 503
        assert (await paused.json())["reason"] == "ingest_paused"
        assert paused.headers["Retry-After"] == str(settings.ingest.paused_retry_after_s)
        assert refusals(ingest, "ingest_paused") == 1
        assert await stream_length(redis, settings) == 0

        flipped = await control.post(
            "/v1/switches/pause-ingest", json={"on": False, "reason": "calm"}, headers=auth
        )
        assert flipped.status == 200
        taken = await ingest.post(
            PATH, data=body, headers=signed_headers(device_key, "dev-a", now_ms(), body)
        )
        assert taken.status == 202
        assert await stream_length(redis, settings) == 1
    finally:
        await ingest.close()
        await control.close()


async def test_openapi_document_describes_every_route(client: TestClient[Any, Any]) -> None:
    document = await (await client.get("/openapi.json")).json()
    assert document == spec()
    app: web.Application = client.server.app
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert routes == documented


async def test_receipt_reads_need_a_valid_read_signature(
    client: TestClient[Any, Any], device_key: bytes
) -> None:
    """The route authenticates like POST: reasons as for updates, counted the same way; a
    valid read of an id without a decision is a 404 `not_decided`, counted as a receipt."""
    path = receipt_path("u1")
    old = now_ms() - 3_600_000
    cases: list[tuple[str, dict[str, str]]] = [
        ("unsigned", {}),
        ("unknown_device", read_headers(device_key, "dev-x", now_ms(), "u1")),
        ("bad_signature", read_headers(bytes(32), "dev-a", now_ms(), "u1")),
        ("bad_signature", read_headers(device_key, "dev-a", now_ms(), "u2")),  # another id
        ("bad_signature", signed_headers(device_key, "dev-a", now_ms(), b"")),  # update domain
        ("signature_expired", read_headers(device_key, "dev-a", old, "u1")),
    ]
    for reason, headers in cases:
        response = await client.get(path, headers=headers)
        assert (response.status, (await response.json())["reason"]) == (401, reason)
    assert refusals(client, "bad_signature") == 3
    valid = await client.get(path, headers=read_headers(device_key, "dev-a", now_ms(), "u1"))
    assert (valid.status, (await valid.json())["reason"]) == (404, "not_decided")
    registry = client.app[INGEST].metrics.registry
    sample = registry.get_sample_value("fedasync_ingest_receipts_total", {"answer": "not_decided"})
    assert sample == 1.0


async def test_a_signature_late_by_redis_clock_is_refused_not_acknowledged(
    settings: Settings, redis: aioredis.Redis, device_key: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingest's clock SKEW_S behind Redis's (another host; or, the same in effect, a stall
    between ingest's check and the XADD): an update signed within the window by ingest's clock
    but outside it by Redis's, the clock the aggregator judges entries by, is refused (401),
    never acknowledged and then dropped by the aggregator as `signature_expired`. Found by an
    outside fault injection (a CLIENT PAUSE WRITE at the window's edge). Nothing is added, no
    retry marker is left: the device's retry, signed afresh, is judged anew and taken."""
    window_ms = settings.auth.window_ms
    skew_ms = 20_000  # margins of 10 s either way: no timing in play
    behind = SimpleNamespace(time=lambda: time.time() - skew_ms / 1000, monotonic=time.monotonic)
    monkeypatch.setattr(ingest_app, "time", behind)  # ingest's module only
    client = await start(ingest_settings(settings), redis)
    try:
        body = body_of("late")
        signed_at = now_ms() - window_ms - skew_ms // 2  # in by ingest's clock, out by Redis's
        late = signed_headers(device_key, "dev-a", signed_at, body)
        response = await client.post(PATH, data=body, headers=late)
        answer = await response.json()
        assert response.status == 401, answer
        assert answer["reason"] == "signature_expired"
        assert "by Redis's clock" in answer["error"]
        assert refusals(client, "signature_expired") == 1.0
        assert await stream_length(redis, settings) == 0
        assert await redis.keys(Keys(settings.redis.key_prefix).ingested("*")) == []

        fresh = signed_headers(device_key, "dev-a", now_ms(), body)
        again = await client.post(PATH, data=body, headers=fresh)
        assert again.status == 202
        assert (await again.json())["retry"] is False  # the first attempt left nothing behind
        assert await stream_length(redis, settings) == 1
    finally:
        await client.close()


async def test_a_device_gone_mid_body_is_counted_and_logged_in_one_line_not_a_traceback(
    client: TestClient[Any, Any],
    device_key: bytes,
    settings: Settings,
    redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by an outside fault injection: devices that timed out while ingest was stopped
    (SIGSTOP) left `ConnectionResetError` tracebacks at ERROR and no count."""
    body = body_of("cut")
    headers = signed_headers(device_key, "dev-a", now_ms(), body)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    port = client.server.port
    assert port is not None
    request = f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nContent-Length: {len(body)}\r\n{head}\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request.encode() + body[: len(body) // 2])
    await writer.drain()
    writer.close()  # gone with half the body sent
    await writer.wait_closed()
    for _ in range(600):  # the handler runs on this loop: the count is the event to wait for
        if refusals(client, "connection_lost") == 1.0:
            break
        await asyncio.sleep(0.05)
    assert refusals(client, "connection_lost") == 1.0
    assert await stream_length(redis, settings) == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    del reader
