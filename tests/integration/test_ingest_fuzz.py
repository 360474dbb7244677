"""1,000 malformed requests against the real ingest service: every one refused with a reason,
each counted once, the service still up and accepting a valid update afterwards.

Hypothesis drives a synchronous test, so the service runs on an event loop in a thread of its
own and requests go over real sockets (http.client), one connection each.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.ingest.app import INGEST, Ingest, create_app
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
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
from fedasync.shared.wire import encode_update, pack
from tests.integration.helpers import make_update

pytestmark = pytest.mark.integration
T = TypeVar("T")
LIMIT = 4096
REQUESTS = 1000


@dataclass
class Running:
    loop: asyncio.AbstractEventLoop
    settings: Settings
    ingest: Ingest
    port: int
    key: bytes

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)


@pytest.fixture
def service(redis_server: RedisServer) -> Iterator[Running]:
    cfg = load_settings(
        redis={"url": redis_server.url, "key_prefix": "t-ingest-fuzz", "socket_timeout_s": 5.0},
        ingest={"max_body_bytes": LIMIT, "rate_per_s": 1e6, "burst": 1_000_000},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    redis = connect(cfg.redis)

    async def start() -> tuple[web.AppRunner, Ingest, int, bytes]:
        key = parse_key(await add_device(redis, Keys(cfg.redis.key_prefix), "dev-a"))
        app = create_app(cfg, redis)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, app[INGEST], runner.addresses[0][1], key

    runner, ingest, port, key = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield Running(loop, cfg, ingest, port, key)
    finally:

        async def stop() -> None:
            await runner.cleanup()
            await redis.aclose()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", PATH, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def now_ms() -> int:
    return int(time.time() * 1000)


header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=80)
hex_text = st.text("0123456789abcdef", min_size=64, max_size=64)


@st.composite
def malformed_requests(draw: st.DrawFn, key: bytes) -> tuple[bytes, dict[str, str]]:
    """A request that must be refused: bad headers, bad signature or bad body, never valid."""
    update_id = draw(st.text("abcdef0123456789", min_size=8, max_size=16))
    body = encode_update(make_update(update_id, 0, client="dev-a"))
    good = signed_headers(key, "dev-a", now_ms(), body)
    kind = draw(
        st.sampled_from(
            ["headers", "signature", "time", "client", "media", "body", "mismatch", "size"]
        )
    )
    if kind == "headers":  # some signature headers missing or replaced by junk
        headers = {"Content-Type": CONTENT_TYPE}
        for name in (CLIENT_HEADER, TIME_HEADER, SIGNATURE_HEADER):
            choice = draw(st.sampled_from(["drop", "junk", "keep"]))
            if choice == "junk":
                headers[name] = draw(header_text)
            elif choice == "keep":
                headers[name] = good[name]
        if all(headers.get(n) == good[n] for n in (CLIENT_HEADER, TIME_HEADER, SIGNATURE_HEADER)):
            headers[SIGNATURE_HEADER] = "0" * 64  # all three kept: break the MAC anyway
        return body, headers
    if kind == "signature":  # a well-formed MAC that is not the right one
        mac = draw(hex_text.filter(lambda s: s != good[SIGNATURE_HEADER]))
        return body, good | {SIGNATURE_HEADER: mac}
    if kind == "time":  # signed far outside the window, or a time the MAC does not cover
        shift = draw(st.integers(301_000, 10**9) | st.integers(-(10**9), -301_000))
        stale = signed_headers(key, "dev-a", now_ms() + shift, body)
        return body, draw(st.sampled_from([stale, good | {TIME_HEADER: stale[TIME_HEADER]}]))
    if kind == "client":  # a device with no key
        client = draw(st.text("xyz0123456789-", min_size=1, max_size=20))
        return body, signed_headers(key, "unknown-" + client, now_ms(), body)
    if kind == "media":
        media = draw(st.sampled_from(["application/json", "text/plain", "application/msgpack"]))
        return body, good | {"Content-Type": media}
    if kind == "size":  # correctly signed, but longer than the limit
        big = body + bytes(draw(st.integers(LIMIT - len(body) + 1, 2 * LIMIT)))
        return big, signed_headers(key, "dev-a", now_ms(), big)
    if kind == "mismatch":  # correctly signed by dev-a, claiming another client inside
        other = encode_update(make_update(update_id, 0, client="dev-b"))
        return other, signed_headers(key, "dev-a", now_ms(), other)
    # correctly signed, but not a valid update message
    bad = draw(
        st.binary(max_size=200)
        | st.builds(lambda n: body[:n], st.integers(0, len(body) - 1))
        | st.builds(lambda tail: body + tail, st.binary(min_size=1, max_size=8))
        | st.builds(lambda v: pack({"schema": v}), st.integers(2, 100))
        | st.builds(lambda v: bytes(msgpack.packb(v)), st.lists(st.integers(), max_size=5))
    )
    return bad, signed_headers(key, "dev-a", now_ms(), bad)


def test_ingest_refuses_1000_malformed_requests_and_counts_each(service: Running) -> None:
    sent: Counter[str] = Counter()

    @settings(
        max_examples=REQUESTS,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(request=malformed_requests(service.key))
    def one(request: tuple[bytes, dict[str, str]]) -> None:
        body, headers = request
        status, answer = post(service.port, body, headers)
        assert 400 <= status < 500, answer
        assert isinstance(answer["reason"], str)
        assert answer["error"]
        sent[answer["reason"]] += 1

    one()

    assert sum(sent.values()) >= REQUESTS
    registry = service.ingest.metrics.registry
    counted = {
        reason: registry.get_sample_value("fedasync_ingest_refusals_total", {"reason": reason})
        for reason in sent
    }
    assert counted == {reason: float(n) for reason, n in sent.items()}
    assert len(sent) >= 10  # the inputs reached many different checks
    # still up: a valid update is accepted, and it is the only entry in the stream
    body = encode_update(make_update("valid-after-fuzz", 0, client="dev-a"))
    status, answer = post(service.port, body, signed_headers(service.key, "dev-a", now_ms(), body))
    assert status == 202, answer
    length = service.call(
        service.ingest.redis.xlen(Keys(service.settings.redis.key_prefix).updates)
    )
    assert length == 1
