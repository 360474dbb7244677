"""Bearer-token checks: every write needs the token, and so does every read unless reads are
explicitly open (FEDASYNC_CONTROL__OPEN_READS=true: status and alerts name clients). Constant-time
compare."""

from __future__ import annotations

import hmac

from aiohttp import web

from fedasync.services.runtime.settings import ControlSettings


def refusal(request: web.Request, settings: ControlSettings, write: bool) -> web.Response | None:
    """None if the request may proceed, else the 401/403 answer (a JSON body, no details)."""
    if not write and settings.open_reads:
        return None
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return web.json_response(
            {"error": "a bearer token is required"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="fedasync"'},
        )
    if settings.token is None:
        return web.json_response(
            {"error": "no token is configured: requests that need one are refused"}, status=403
        )
    given = header.removeprefix("Bearer ")
    # a non-ASCII header (any byte aiohttp could not decode) is simply not the token
    if not given.isascii() or not hmac.compare_digest(given.encode(), settings.token.encode()):
        return web.json_response({"error": "invalid token"}, status=403)
    return None
