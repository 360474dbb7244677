"""A request aiohttp cannot parse, answered as JSON and logged in one line, never with a traceback.

aiohttp answers a request head it cannot parse (a NUL in a header, a broken request line, a URL
or a header line over its 8 KB limits) with a `text/plain` 400 that echoes the request's bytes,
and logs it at ERROR with a traceback: 60 bytes from anyone became 630 bytes of ERROR log. The
connections of every service are served by `JsonErrorHandler` instead (http_service.listening):
the same 400, as the JSON error every other answer is (`{"error", "reason"}`), one WARNING line
naming the service, the peer and the kind of fault but none of the request's bytes, and a count
by kind (`fedasync_http_malformed_requests_total`, on the service's /metrics): both the guard's,
which sees every connection (http_guard.py, `Guard.malformed`).

An error that is not the client's (a handler's bug, answered 500) keeps aiohttp's traceback in
the log, where a bug belongs; only its answer becomes JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import http_exceptions as bad
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

#: told of each unparsable request: its reason (one of REASONS) and the peer's address
Report = Callable[[str, str | None], None]

#: what a head aiohttp refused was, most specific first: (exception, reason, answer's message).
#: The messages are fixed: aiohttp's own quote the request's bytes
KINDS: tuple[tuple[type[bad.HttpProcessingError], str, str], ...] = (
    (bad.LineTooLong, "line_too_long", "a request line or header line is over the size limit"),
    (bad.InvalidHeader, "invalid_header", "a header line is not valid HTTP"),
    (bad.BadHttpMethod, "bad_method", "the request line's method is not an HTTP method"),
    (bad.InvalidURLError, "invalid_url", "the request's URL is not valid"),
    (bad.BadStatusLine, "bad_request_line", "the request line is not valid HTTP"),
    # what llhttp (aiohttp's C parser) raises for a bad header line (a NUL) or chunk framing
    (bad.HttpProcessingError, "bad_request", "the request is not valid HTTP (head or framing)"),
)
#: the `reason` label values of fedasync_http_malformed_requests
REASONS = tuple(reason for _, reason, _ in KINDS)


def kind(exc: bad.HttpProcessingError) -> tuple[str, str]:
    """(reason, message) for what aiohttp's parser raised."""
    return next((reason, text) for cls, reason, text in KINDS if isinstance(exc, cls))


class JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, with its error answers in JSON; a parse error is reported
    to `report` (its reason, the peer), which logs and counts it, instead of logged here."""

    def __init__(self, manager: web.Server, report: Report, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._report = report

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, bad.HttpProcessingError):
            answer = super().handle_error(request, status, exc, message)  # logs the traceback
            return _json(answer.status, answer.reason or "error", "internal_error")
        # the client's fault, also when a handler's body read raised it (a broken chunked
        # encoding, a body shorter than its Content-Length), which aiohttp would answer 500
        reason, text = kind(exc)
        self._report(reason, request.remote)
        if request.writer.output_size > 0:  # as aiohttp's: an answer is already on its way
            raise ConnectionError("an answer was sent already; cannot send the error")
        return _json(exc.code if 400 <= exc.code < 500 else 400, text, reason)


def _json(status: int, message: str, reason: str) -> web.Response:
    answer = web.json_response({"error": message, "reason": reason}, status=status)
    answer.force_close()  # the connection's state is unknown after an unparsable head
    return answer


def handler_factory(server: web.Server, report: Report) -> Callable[[], Any]:
    """What `server()` builds (one `RequestHandler` per connection, with the options the runner
    was given), as a `JsonErrorHandler`."""
    options: dict[str, Any] = server._kwargs  # the runner's and the app's handler options
    loop = server._loop
    return lambda: JsonErrorHandler(server, report, loop=loop, **options)
