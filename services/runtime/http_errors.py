"""Every HTTP error of every service is JSON, also those aiohttp raises before a handler runs.

The handlers answer their own errors as `{"error": …}` (ingest adds a `reason` code). Without this
middleware a request for a path no route serves (404), with a method its route does not take
(405), or with an `Expect` ingest does not know (417), would get aiohttp's plain text, and a
device would have to parse two kinds of error. Each such answer is logged, so a client that is
misconfigured (a wrong base URL, an id not percent-encoded) shows up in the service's log.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from aiohttp.typedefs import Handler

log = logging.getLogger(__name__)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An HTTP error raised as an exception (not returned by a handler) answered as JSON, with its
    status and headers (405 keeps `Allow`); a JSON error raised on purpose passes unchanged."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        message = _message(exc, request)
        log.info("%s %s: %d %s", request.method, request.path[:200], exc.status, message)
        headers = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
        body = {"error": message, "reason": _code(exc.reason)}
        return web.json_response(body, status=exc.status, headers=headers)


#: headers of the plain-text answer that do not describe the JSON one
_BODY_HEADERS = frozenset({"content-type", "content-length"})


def _message(exc: web.HTTPException, request: web.Request) -> str:
    default = f"{exc.status}: {exc.reason}"
    if exc.text and exc.text != default:
        return exc.text  # a message of the service's own, raised as plain text
    if exc.status == 404:
        return f"no such path: {request.path[:200]} (see docs/http-api.md for the routes)"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"{request.method} is not allowed on {request.path[:200]}; allowed: {allowed}"
    return exc.reason


def _code(reason: str) -> str:
    """`Method Not Allowed` → `method_not_allowed`: the `reason` field's style."""
    return re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_")
