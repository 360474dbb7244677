"""Issue 25: bodies read before their MAC is checked cost ingest memory, for anyone who knows a
client id. The real ingest app against a real Redis: the budget of unverified bytes (503 with
Retry-After, counted), the body limit derived from the run's model (the real aggregator's), and
bodies held in flight while a genuine device's update goes through."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.client import DeviceClient, RetryPolicy
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.ingest.app import INGEST, create_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import add_device
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import (
    CLIENT_HEADER,
    CONTENT_TYPE,
    PATH,
    SIGNATURE_HEADER,
    TIME_HEADER,
    signed_headers,
)
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from fedasync.shared.update_size import max_update_bytes
from fedasync.shared.wire import encode_update
from tests.integration.helpers import SIZE, initial_state

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LIMIT = 4096
BUDGET = 6000
RETRY_AFTER_S = 2
#: how long a poll for the app's own accounting may take before the test fails
DEADLINE_S = 30.0


def with_ingest(settings: Settings, **ingest: Any) -> Settings:
    section = settings.ingest.model_copy(update={"rate_per_s": 1000.0, "burst": 1000} | ingest)
    return settings.model_copy(update={"ingest": section})


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest_asyncio.fixture
async def keys(settings: Settings, redis: aioredis.Redis) -> dict[str, bytes]:
    store = Keys(settings.redis.key_prefix)
    return {name: parse_key(await add_device(redis, store, name)) for name in ("dev-a", "dev-b")}


@pytest_asyncio.fixture
async def budgeted(
    settings: Settings, redis: aioredis.Redis
) -> AsyncIterator[TestClient[Any, Any]]:
    configured = with_ingest(
        settings,
        max_body_bytes=LIMIT,
        unverified_bytes=BUDGET,
        budget_retry_after_s=RETRY_AFTER_S,
    )
    client = TestClient(TestServer(create_app(configured, redis)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def sample(client: TestClient[Any, Any], name: str, labels: dict[str, str] | None = None) -> float:
    registry = client.app[INGEST].metrics.registry
    return float(registry.get_sample_value(name, labels or {}) or 0.0)


def refusals(client: TestClient[Any, Any], reason: str) -> float:
    return sample(client, "fedasync_ingest_refusals_total", {"reason": reason})


def in_flight(client: TestClient[Any, Any]) -> int:
    return client.app[INGEST].budget.in_flight


async def until(what: str, check: Any) -> None:
    """Poll the app's own state (the handlers run on this loop) until `check()` holds."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(0.01)


def forged_head(client_id: str, *, length: int | None) -> bytes:
    """The head of a POST claiming `client_id` with a MAC nobody's key made."""
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: ingest\r\nConnection: close\r\n"
        f"Content-Type: {CONTENT_TYPE}\r\n"
        f"{CLIENT_HEADER}: {client_id}\r\n{TIME_HEADER}: {now_ms()}\r\n"
        f"{SIGNATURE_HEADER}: {'ab' * 32}\r\n{framing}\r\n\r\n"
    ).encode()


async def connect(
    client: TestClient[Any, Any],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = client.server.port
    assert port is not None
    return await asyncio.open_connection("127.0.0.1", port)


async def answer_to_head(
    client: TestClient[Any, Any], head: bytes, body: bytes = b""
) -> tuple[int, dict[str, str], Any]:
    """Send a request head (and `body`, if any): status, headers and JSON of the answer. With
    no body, an answer comes only if the body is refused unread."""
    reader, writer = await connect(client)
    try:
        writer.write(head + body)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()
    raw_head, _, payload = reply.partition(b"\r\n\r\n")
    lines = raw_head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(payload)


async def post(
    client: TestClient[Any, Any], key: bytes, device: str, update_id: str, weights: int = SIZE
) -> tuple[int, dict[str, Any]]:
    update = Update(update_id, device, 0, 10, np.ones(weights, np.float32), created_at=1.0)
    body = encode_update(update)
    response = await client.post(
        PATH, data=body, headers=signed_headers(key, device, now_ms(), body)
    )
    return response.status, await response.json()


async def test_unverified_bytes_beyond_the_budget_get_503_with_retry_after_and_are_counted(
    budgeted: TestClient[Any, Any],
    keys: dict[str, bytes],
    settings: Settings,
    redis: aioredis.Redis,
) -> None:
    # a forged body claiming dev-b, its length declared, a quarter sent: it holds its bytes
    held = 4000
    reader, writer = await connect(budgeted)
    writer.write(forged_head("dev-b", length=held) + bytes(1000))
    await writer.drain()
    await until("the held body's reservation", lambda: in_flight(budgeted) == held)

    # meanwhile a genuine device's update goes through: within the budget, in all and its own
    assert (await post(budgeted, keys["dev-a"], "dev-a", "a1"))[0] == 202

    # a body beyond the budget in all is refused before a byte of it is read
    status, headers, answer = await answer_to_head(budgeted, forged_head("dev-a", length=3000))
    assert (status, answer["reason"]) == (503, "unverified_budget")
    assert headers["Retry-After"] == str(RETRY_AFTER_S)
    assert f"budget {BUDGET}" in answer["error"]

    # and one beyond its client id's share (the body limit): the id the held body claims
    status, answer = await post(budgeted, keys["dev-b"], "dev-b", "b1")
    assert (status, answer["reason"]) == (503, "unverified_budget")
    assert "'dev-b'" in answer["error"]
    assert refusals(budgeted, "unverified_budget") == 2.0
    assert sample(budgeted, "fedasync_ingest_unverified_bytes") == held

    # the held body goes away: its bytes are given back, and dev-b's retry is taken
    writer.close()
    await until("the reservation given back", lambda: in_flight(budgeted) == 0)
    assert not budgeted.app[INGEST].budget.by_client
    assert (await post(budgeted, keys["dev-b"], "dev-b", "b1"))[0] == 202
    assert int(await redis.xlen(Keys(settings.redis.key_prefix).updates)) == 2
    del reader


async def test_a_body_is_let_in_alone_even_above_the_budget(
    settings: Settings, redis: aioredis.Redis, keys: dict[str, bytes]
) -> None:
    """A budget below one body slows uploads down to one at a time, never stops them."""
    configured = with_ingest(settings, max_body_bytes=LIMIT, unverified_bytes=1024)
    client = TestClient(TestServer(create_app(configured, redis)))
    await client.start_server()
    try:
        assert (await post(client, keys["dev-a"], "dev-a", "big", weights=900))[0] == 202
        assert sample(client, "fedasync_ingest_body_bytes_sum") > 900 * 4 > 1024
    finally:
        await client.close()


async def test_the_body_limit_is_the_largest_update_of_the_run_models_layout(
    settings: Settings, redis: aioredis.Redis, keys: dict[str, bytes]
) -> None:
    configured = with_ingest(settings)  # no FEDASYNC_INGEST__MAX_BODY_BYTES: derived
    assert configured.ingest.max_body_bytes is None
    client = TestClient(TestServer(create_app(configured, redis)))
    await client.start_server()
    try:
        # no model committed yet: no layout to go by, the wire's cap
        assert (await post(client, keys["dev-a"], "dev-a", "early"))[0] == 202
        limit_gauge = "fedasync_ingest_body_limit_bytes"
        assert sample(client, limit_gauge) == settings.wire.max_message_bytes

        # the aggregator commits the run's first model (a layout of SIZE parameters)
        await run_aggregator(
            settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
        )
        client.app[INGEST].body_limit._next_look = 0.0  # look now, not at the next refresh
        limit = max_update_bytes(SIZE)
        assert (await post(client, keys["dev-a"], "dev-a", "u1"))[0] == 202
        assert sample(client, limit_gauge) == limit

        # declared beyond it: refused unread
        read = sample(client, "fedasync_ingest_read_bytes_total")
        status, _, answer = await answer_to_head(client, forged_head("dev-a", length=limit + 1))
        assert (status, answer["reason"]) == (413, "too_large")
        assert sample(client, "fedasync_ingest_read_bytes_total") == read

        # a forged chunked body of 1 MiB: cut off once past the limit, the rest never read
        forged = 2**20
        reader, writer = await connect(client)
        writer.write(forged_head("dev-a", length=None))
        sent = 0
        try:
            while sent < forged:
                writer.write(b"%x\r\n%s\r\n" % (4096, bytes(4096)))
                await writer.drain()
                sent += 4096
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass  # closed by ingest once it refused: the answer was sent before
        reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 413 ")
        taken = sample(client, "fedasync_ingest_read_bytes_total") - read
        assert limit < taken < forged // 4, taken  # the limit and what was in flight, no more
        await until("the reservation given back", lambda: in_flight(client) == 0)
        assert refusals(client, "too_large") == 2.0
        assert int(await redis.xlen(Keys(settings.redis.key_prefix).updates)) == 2
    finally:
        await client.close()


async def test_an_explicit_body_limit_overrides_the_models(
    settings: Settings, redis: aioredis.Redis, keys: dict[str, bytes]
) -> None:
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    explicit = max_update_bytes(SIZE) + 5000
    client = TestClient(
        TestServer(create_app(with_ingest(settings, max_body_bytes=explicit), redis))
    )
    await client.start_server()
    try:
        # within the setting, beyond the model's: read, and refused for its MAC
        status, _, answer = await answer_to_head(
            client, forged_head("dev-a", length=explicit), bytes(explicit)
        )
        assert (status, answer["reason"]) == (401, "bad_signature")
        status, _, answer = await answer_to_head(client, forged_head("dev-a", length=explicit + 1))
        assert (status, answer["reason"]) == (413, "too_large")
        assert sample(client, "fedasync_ingest_body_limit_bytes") == explicit
    finally:
        await client.close()


async def test_a_device_client_waits_out_a_spent_budget_without_using_up_its_attempts(
    budgeted: TestClient[Any, Any],
    keys: dict[str, bytes],
    settings: Settings,
    redis: aioredis.Redis,
) -> None:
    """Forged bodies holding the budget must not make a genuine device give up: the client
    (allowed no retry at all) waits each `503 unverified_budget` out and is taken once the
    forged body is gone."""
    reader, writer = await connect(budgeted)
    writer.write(forged_head("dev-b", length=4000) + bytes(1000))
    await writer.drain()
    await until("the held body's reservation", lambda: in_flight(budgeted) == 4000)

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:  # three refusals waited out: the forged body goes away
            writer.close()
            await until("the reservation given back", lambda: in_flight(budgeted) == 0)

    device = DeviceClient(
        "http://127.0.0.1:1",
        "dev-a",
        key=keys["dev-a"],
        ingest_url=f"http://127.0.0.1:{budgeted.server.port}",
        retry=RetryPolicy(attempts=0),
        sleep=sleep,
    )
    async with device:
        published = await device.publish(np.ones(800, np.float32), 0, 10, update_id="a-big")
    assert published.update_id == "a-big"
    assert refusals(budgeted, "unverified_budget") == 3.0  # the fault happened, three times
    assert waits == [float(RETRY_AFTER_S)] * 3  # each after the service's Retry-After
    assert int(await redis.xlen(Keys(settings.redis.key_prefix).updates)) == 1
    del reader


async def test_a_trickled_forged_body_gives_its_share_back_at_its_deadline(
    settings: Settings, redis: aioredis.Redis, keys: dict[str, bytes]
) -> None:
    """A forged body sent a byte at a time, each pause within the guard's limit, must not hold
    its client id's share of the budget for ever (the genuine device would be refused for as
    long as the trickle lasts): at its deadline it is refused, 408, and its share given back."""
    configured = with_ingest(settings, max_body_bytes=LIMIT, min_upload_bytes_per_s=100_000)
    configured = configured.model_copy(
        update={"http": configured.http.model_copy(update={"body_timeout_s": 0.5})}
    )
    client = TestClient(TestServer(create_app(configured, redis)))
    await client.start_server()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await connect(client)
        writer.write(forged_head("dev-a", length=1200) + bytes(10))  # then nothing more
        await writer.drain()
        await until("the trickled body's reservation", lambda: in_flight(client) == 1200)
        # the genuine dev-a is refused while the trickle holds its share (the fault)
        status, answer = await post(client, keys["dev-a"], "dev-a", "a1", weights=900)
        assert (status, answer["reason"]) == (503, "unverified_budget")

        reply = await asyncio.wait_for(reader.read(), DEADLINE_S)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.split()[1] == b"408"
        assert json.loads(body)["reason"] == "upload_too_slow"
        await until("the share given back", lambda: in_flight(client) == 0)
        assert refusals(client, "upload_too_slow") == 1.0
        assert (await post(client, keys["dev-a"], "dev-a", "a1", weights=900))[0] == 202
    finally:
        if writer is not None:
            writer.close()
        await client.close()
