"""Requests aiohttp cannot parse, sent over raw sockets to every real service (issue 25, item 3).

A NUL in a header, a broken request line and a URL over 8 KB are each answered 400 with the JSON
error every other answer has (`error`, `reason`), closed, logged in exactly one WARNING line that
quotes none of the request's bytes (no traceback, nothing at ERROR), and counted by reason on
the service's /metrics (`fedasync_http_malformed_requests_total`).
"""

from __future__ import annotations

import json
import logging

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.runtime.http_service import listening
from fedasync.services.runtime.settings import HttpSettings, Settings
from tests.integration.test_slow_clients import (
    SERVICES,
    configured,
    metrics,
    open_raw,
    running,
    until_closed,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: bytes no log line may quote (each request below carries it)
MARK = "zq7mark"
MALFORMED = {
    # a NUL inside a header value (llhttp says no more than "bad request")
    "bad_request": f"GET /livez HTTP/1.1\r\nHost: test\r\nX-{MARK}: a\x00b\r\n\r\n".encode(),
    # a request line that is not one
    "bad_request_line": f"GET /livez{MARK} HTTP/1.1 trailing\r\nHost: test\r\n\r\n".encode(),
    # a URL over aiohttp's 8 KB limit for a request line
    "line_too_long": f"GET /livez?{MARK}={'a' * 9000} HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
}


Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def malformed_count(figures: Figures, reason: str) -> float:
    return figures[("fedasync_http_malformed_requests_total", (("reason", reason),))]


@pytest.mark.parametrize("name", [*SERVICES, "evaluator"])
async def test_a_malformed_request_gets_a_json_400_one_warning_line_and_a_count(
    name: str, settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(name, configured(settings), redis) as port:
        before = await metrics(port)
        for reason, request in MALFORMED.items():
            caplog.clear()
            with caplog.at_level(logging.DEBUG):
                reader, writer = await open_raw(port)
                try:
                    writer.write(request)
                    answer = await until_closed(reader)
                finally:
                    writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), (reason, head)
            assert b"Content-Type: application/json" in head, (reason, head)
            document = json.loads(body)
            assert document["reason"] == reason, document
            assert isinstance(document["error"], str)
            assert MARK.encode() not in answer  # the answer echoes none of the request
            loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
            malformed = [r for r in loud if "malformed request" in r.getMessage()]
            assert len(malformed) == 1, [r.getMessage() for r in loud]
            assert malformed[0].levelno == logging.WARNING
            assert reason in malformed[0].getMessage()
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere
            assert not [r for r in caplog.records if MARK in r.getMessage()]
        after = await metrics(port)
        for reason in MALFORMED:
            assert malformed_count(after, reason) == malformed_count(before, reason) + 1


async def test_a_handler_s_bug_is_a_json_500_with_its_traceback_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not the client's fault: the traceback stays in the log (where a bug belongs), the answer
    is the JSON error all others are, not aiohttp's text."""

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app = web.Application()
    app.router.add_get("/broken", broken)
    async with listening("test", app, "127.0.0.1", 0, HttpSettings()) as port:
        reader, writer = await open_raw(port)
        try:
            writer.write(b"GET /broken HTTP/1.1\r\nHost: t\r\n\r\n")
            answer = await until_closed(reader)
        finally:
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 "), head
    assert json.loads(body)["reason"] == "internal_error"
    [logged] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged.exc_info is not None
    assert isinstance(logged.exc_info[1], RuntimeError)
