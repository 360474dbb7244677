"""Bearer-token checks: every write needs the token, and so does every read unless reads are
explicitly open (FEDASYNC_CONTROL__OPEN_READS=true: status and alerts name clients). Constant-time
compare.

Each handler declares what it needs (`@needs(READ)`, `@needs(WRITE)`) and one middleware
(`token_checked`) answers for all of them, before the handler reads anything: a route cannot
forget the check, and the check is written once. A handler that declares nothing (the dashboard,
/metrics, /livez, /readyz, /openapi.json) is open.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fedasync.services.runtime.settings import ControlSettings


class Access(enum.Enum):
    """What a route does: a read (open when reads are open) or a write (always the token)."""

    READ = "read"
    WRITE = "write"


READ, WRITE = Access.READ, Access.WRITE

#: the attribute of a handler that holds the Access it declared
_DECLARED = "fedasync_access"

H = TypeVar("H", bound=Callable[..., object])


def needs(access: Access) -> Callable[[H], H]:
    """Declare the access a handler needs; `token_checked` enforces it."""

    def declare(handler: H) -> H:
        setattr(handler, _DECLARED, access)
        return handler

    return declare


def declared(handler: object) -> Access | None:
    """The access `handler` declared with `needs`, None if it declared none (an open route)."""
    access = getattr(handler, _DECLARED, None)
    return access if isinstance(access, Access) else None


def token_checked(settings: ControlSettings) -> Middleware:
    """A middleware answering 401/403 for a route whose declared access the request lacks.

    It reads the route's own handler (`match_info.handler`: a HEAD is routed to its GET's), so
    it must run innermost, after the query-string check, as the handlers' own check did."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        access = declared(request.match_info.handler)
        if access is not None:
            denied = refusal(request, settings, write=access is WRITE)
            if denied is not None:
                return denied
        return await handler(request)

    return check_token


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
