"""Bearer-token checks: every write needs the token; reads as configured. Constant-time compare."""

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
            {"error": "writes are disabled: no token is configured"}, status=403
        )
    given = header.removeprefix("Bearer ").encode()
    if not hmac.compare_digest(given, settings.token.encode()):
        return web.json_response({"error": "invalid token"}, status=403)
    return None
