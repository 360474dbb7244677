"""The device client's POST to ingest (the worker publishes through it) survives answers that
are not ingest's JSON.

Between a device and ingest there may be a proxy: its 502 is an HTML page, aiohttp's own 500 is
text, and its Retry-After may be an HTTP-date. A tiny real aiohttp server in the test answers
from a script, one answer per request, and records what it was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiohttp import web

from fedasync.client import Abandoned, DeviceClient, PreparedUpdate, Refused, RetryPolicy
from fedasync.client.retry import DEFAULT_RETRY_AFTER_S, MAX_RETRY_AFTER_S, retry_after_s
from fedasync.shared.ingest_protocol import PATH

KEY = bytes(range(32))
RAW = b"the same update bytes on every attempt"
UPDATE = PreparedUpdate("u", 0, RAW)
HTTP_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"


def accepted(entry_id: str) -> web.Response:
    body = {"status": "accepted", "update_id": "u", "entry_id": entry_id, "retry": False}
    return web.json_response(body, status=202)


def proxy_502() -> web.Response:
    page = "<html><body><h1>502 Bad Gateway</h1></body></html>"
    return web.Response(status=502, text=page, content_type="text/html")


def crash() -> web.Response:
    """A handler bug: aiohttp answers its own text/plain 500."""
    raise RuntimeError("handler bug")


@dataclass
class ScriptedIngest:
    """Answers POST /v1/updates with the next answer of the script; records the bodies."""

    script: list[Callable[[], web.Response]]
    bodies: list[bytes] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return self.script.pop(0)()


@pytest_asyncio.fixture
async def ingest() -> AsyncIterator[ScriptedIngest]:
    server = ScriptedIngest(script=[])
    app = web.Application()
    app.router.add_post(PATH, server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def send(server: ScriptedIngest, waits: list[float], attempts: int = 5) -> str:
    async def record(seconds: float) -> None:
        waits.append(seconds)

    client = DeviceClient(
        "http://127.0.0.1:1",  # no model is fetched here
        "device-0",
        key=KEY,
        ingest_url=server.url,
        retry=RetryPolicy(attempts=attempts),
        sleep=record,
    )
    async with client:
        return (await client.send(UPDATE)).entry_id


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_proxy_502_html_page_is_retried_with_the_same_bytes(
    ingest: ScriptedIngest,
) -> None:
    ingest.script = [proxy_502, lambda: accepted("7-0")]
    waits: list[float] = []
    assert await send(ingest, waits) == "7-0"
    assert ingest.bodies == [RAW, RAW]
    assert waits == [DEFAULT_RETRY_AFTER_S]  # no Retry-After: the 1 s default


@pytest.mark.integration
@pytest.mark.asyncio
async def test_text_500_and_an_http_date_retry_after_are_retried(
    ingest: ScriptedIngest,
) -> None:
    def unavailable_until_a_date() -> web.Response:
        return web.Response(status=503, text="busy", headers={"Retry-After": HTTP_DATE})

    def rate_limited() -> web.Response:
        body = {"error": "slow down", "reason": "rate_limited"}
        return web.json_response(body, status=429, headers={"Retry-After": "3"})

    ingest.script = [crash, unavailable_until_a_date, rate_limited, lambda: accepted("9-1")]
    waits: list[float] = []
    assert await send(ingest, waits) == "9-1"
    assert ingest.bodies == [RAW] * 4
    assert waits == [DEFAULT_RETRY_AFTER_S, DEFAULT_RETRY_AFTER_S, 3.0]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_202_without_an_entry_id_is_asked_again(ingest: ScriptedIngest) -> None:
    """The update id makes the second POST the same update: ingest answers it as a retry."""
    ingest.script = [lambda: web.Response(status=202, text="ok"), lambda: accepted("3-0")]
    assert await send(ingest, []) == "3-0"
    assert ingest.bodies == [RAW, RAW]


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_4xx_that_is_not_json_is_a_refusal_for_an_unknown_reason(
    ingest: ScriptedIngest,
) -> None:
    page = "<html>403 Forbidden by the proxy</html>"
    ingest.script = [lambda: web.Response(status=403, text=page, content_type="text/html")]
    with pytest.raises(Refused) as refused:
        await send(ingest, [])
    assert (refused.value.status, refused.value.reason) == (403, "unknown")
    assert ingest.bodies == [RAW]  # refused for good: not sent again


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_json_refusal_keeps_ingest_s_reason(ingest: ScriptedIngest) -> None:
    body = {"error": "bad signature", "reason": "bad_signature"}
    ingest.script = [lambda: web.json_response(body, status=401)]
    with pytest.raises(Refused) as refused:
        await send(ingest, [])
    assert (refused.value.status, refused.value.reason) == (401, "bad_signature")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_5xx_forever_gives_up_after_the_attempts(ingest: ScriptedIngest) -> None:
    ingest.script = [proxy_502] * 3
    with pytest.raises(ConnectionError, match="after 2 retries: 502 unknown"):
        await send(ingest, [], attempts=2)
    assert ingest.bodies == [RAW] * 3


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, DEFAULT_RETRY_AFTER_S),
        ("2", 2.0),
        ("0.5", 0.5),
        (HTTP_DATE, DEFAULT_RETRY_AFTER_S),
        ("soon", DEFAULT_RETRY_AFTER_S),
        ("inf", DEFAULT_RETRY_AFTER_S),
        ("nan", DEFAULT_RETRY_AFTER_S),
        ("-5", DEFAULT_RETRY_AFTER_S),
        ("86400", MAX_RETRY_AFTER_S),
    ],
)
def test_retry_after_is_a_number_of_seconds_or_the_default(
    header: str | None, seconds: float
) -> None:
    assert retry_after_s(header) == seconds


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_stop_while_ingest_is_paused_gives_the_update_up_at_once(
    ingest: ScriptedIngest,
) -> None:
    stopping = asyncio.Event()

    def paused_then_stop() -> web.Response:
        stopping.set()  # the worker is told to stop while it waits out an hour-long pause
        body = {"error": "ingest paused", "reason": "ingest_paused"}
        return web.json_response(body, status=503, headers={"Retry-After": "3600"})

    ingest.script = [paused_then_stop]
    client = DeviceClient(
        "http://127.0.0.1:1", "device-0", key=KEY, ingest_url=ingest.url, stopping=stopping
    )
    async with client:
        with pytest.raises(Abandoned):
            await client.send(UPDATE)
    assert len(ingest.bodies) == 1  # no second attempt after the stop
