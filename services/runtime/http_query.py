"""Query strings: a route takes the query keys its OpenAPI document names, and nothing else.

An answer cached for ever (`GET /v1/models/{version}`, immutable) is cached by its URL, query
string included (the nginx edge keys its cache on it): were `?zz=1` or `?format=AAA` answered
200, one version would have unlimited cacheable URLs, and anyone could fill or bust the cache.
So every service answers `400` (JSON, `reason` below) to a query key the document does not give
the route (`unknown_query_key`), a key given twice (`repeated_query_key`) and a value outside the
key's `enum` (`bad_query_value`); the rules of the values themselves (a version, a count) stay
the handlers'. The document is the one the service serves at /openapi.json (`documented`), so
what the service says it takes and what it takes are one table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

log = logging.getLogger(__name__)

#: (path template, method) → {query key: its allowed values, or None for any}
QueryRules = dict[tuple[str, str], dict[str, frozenset[str] | None]]


def query_rules(document: Mapping[str, Any]) -> QueryRules:
    """What each operation of an OpenAPI document takes in its query string."""
    rules: QueryRules = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            keys: dict[str, frozenset[str] | None] = {}
            for parameter in operation.get("parameters", ()):
                if parameter["in"] == "query":
                    enum = parameter.get("schema", {}).get("enum")
                    keys[parameter["name"]] = None if enum is None else frozenset(enum)
            rules[(path, method.upper())] = keys
    return rules


def query_refusal(rules: QueryRules, request: web.Request) -> web.Response | None:
    """The 400 for a query string the request's route does not take, or None."""
    if not request.query:
        return None
    resource = request.match_info.route.resource
    method = "GET" if request.method == "HEAD" else request.method  # a cache keys HEAD as GET
    taken = None if resource is None else rules.get((resource.canonical, method))
    if taken is None:
        return None  # no route (404) or an undocumented method (405): aiohttp's to answer
    seen: set[str] = set()
    for key, value in request.query.items():
        if key not in taken:
            names = ", ".join(sorted(taken)) or "none"
            return _refused("unknown_query_key", f"unknown query key {key[:40]!r}; takes {names}")
        if key in seen:
            return _refused("repeated_query_key", f"query key {key!r} given twice")
        seen.add(key)
        allowed = taken[key]
        if allowed is not None and value not in allowed:
            values = ", ".join(sorted(allowed))
            return _refused("bad_query_value", f"{key} must be one of: {values}")
    return None


def _refused(reason: str, message: str) -> web.Response:
    log.info("400 %s: %s", reason, message)
    return web.json_response({"error": message, "reason": reason}, status=400)


def query_checked(document: Mapping[str, Any]) -> Middleware:
    """A middleware refusing, before any handler, query strings `document` does not allow."""
    rules = query_rules(document)

    @web.middleware
    async def check_query(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = query_refusal(rules, request)
        return refused if refused is not None else await handler(request)

    return check_query


def documented(app: web.Application, document: Mapping[str, Any]) -> None:
    """`app` serves `document` at /openapi.json, and takes only the query strings it allows.
    Call before the app starts (its middlewares are frozen then)."""
    body = dict(document)

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(body)

    app.middlewares.append(query_checked(document))
    app.router.add_get("/openapi.json", openapi)
