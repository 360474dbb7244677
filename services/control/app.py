"""HTTP API of the control service: the policy in force, changes to it and their history, and
status.

Every policy change is validated by the core's own rules (shared/policy.py, shared/params.py),
stored as a new policy version with who, when and why (services/stores/policy_store.py), and picked
up by the aggregator at its next batch boundary, so the ledger shows which decisions it made.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler
from redis.exceptions import RedisError, ResponseError

from fedasync.services.control.auth import READ, WRITE, needs, token_checked
from fedasync.services.control.metrics import ControlMetrics
from fedasync.services.control.openapi import MAX_COUNT, spec
from fedasync.services.control.privacy import PRIVACY_FIELDS, privacy_refusal, privacy_status
from fedasync.services.control.rules_runner import RuleRunner
from fedasync.services.control.switchboard import AlreadyInState, set_switch
from fedasync.services.control.window import LedgerWindow
from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import BACKGROUND, livez, redis_readiness
from fedasync.services.runtime.lifecycle import Background
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT, get_bytes
from fedasync.services.runtime.settings import BudgetSettings, Settings
from fedasync.services.stores import evaluations
from fedasync.services.stores.alerts import alert_record
from fedasync.services.stores.backlog import read_backlog
from fedasync.services.stores.policy_store import (
    NoPolicy,
    PolicyConflict,
    change_policy,
    policy_log,
    read_policy,
)
from fedasync.services.stores.run_record import recorded_budget
from fedasync.shared.keys import Keys
from fedasync.shared.params import Conflict, ParamError
from fedasync.shared.policy import POLICY_RANGES, SCHEMA, Policy
from fedasync.shared.switches import SWITCHES

SETTINGS = web.AppKey("settings", Settings)
REDIS = web.AppKey("redis", aioredis.Redis)
KEYS = web.AppKey("keys", Keys)
WINDOW = web.AppKey("window", LedgerWindow)
METRICS = web.AppKey("metrics", ControlMetrics)

#: the policy fields that set a budget (their change is checked against what is used up)
BUDGET_FIELDS = frozenset({"max_updates", "max_seconds", "privacy_budget"})


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


log = logging.getLogger(__name__)


class BadBody(Exception):
    """A request body that is not what the route takes: answered with `status` and `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _json_body(request: web.Request) -> Any:
    """The parsed body; BadBody for anything but identity-encoded UTF-8 JSON of bounded depth.

    Nested deeper than the parser's recursion limit (json raises RecursionError) is a 400 like any
    other malformed body, and a compressed body is refused unread: nothing is ever inflated.
    """
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise BadBody(415, f"Content-Encoding {encoding!r} is not accepted; send the body as is")
    try:
        return await request.json()
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError alike
        raise BadBody(
            400, "the body must be JSON (UTF-8), nested at most a few hundred deep"
        ) from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: Any) -> str:
    """Free text from a request (a reason, an operator's name) as storable UTF-8: a lone
    surrogate (JSON `"\\ud800"`, or a header byte that is not UTF-8) becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", str(value))


def _operator(request: web.Request) -> str:
    return _text(request.headers.get("X-Fedasync-Operator", "operator"))


@needs(READ)
async def get_policy(request: web.Request) -> web.Response:
    policy = await read_policy(request.app[REDIS], request.app[KEYS])
    ranges = {name: str(allowed) for name, allowed in POLICY_RANGES.items()}
    return web.json_response({"policy": policy.to_dict(complete=True), "ranges": ranges})


@needs(WRITE)
async def patch_policy(request: web.Request) -> web.Response:
    """Body: {"changes": {param: value, ...}, "why": "..."}; the version is raised by one."""
    try:
        body = await _json_body(request)
    except BadBody as exc:
        return _error(exc.status, exc.message)
    changes = body.get("changes") if isinstance(body, dict) else None
    why = body.get("why", "") if isinstance(body, dict) else ""
    if not isinstance(changes, dict) or not changes or not isinstance(why, str):
        return _error(400, 'expected {"changes": {...}, "why": "..."} with at least one change')
    redis, keys = request.app[REDIS], request.app[KEYS]
    current = await read_policy(redis, keys)
    try:  # names, types and ranges: the policy schema's, as everywhere (shared/policy.py)
        new = current.evolve(**_integers(changes))
    except Conflict as exc:  # allowed values this run may not change to (shared/params.py)
        return _error(409, str(exc), field=exc.param, allowed=exc.allowed)
    except ParamError as exc:
        return _error(422, str(exc), field=exc.param, allowed=exc.allowed)
    if BUDGET_FIELDS & set(changes):
        exceeded = await budget_refusal(request, new)
        if exceeded is not None:
            return exceeded
    if PRIVACY_FIELDS & set(changes):
        window = request.app[WINDOW]
        await window.refresh(time.time())  # ε spent, from the ledger up to now
        refused = privacy_refusal(current, new, window.spent)
        if refused is not None:
            return web.json_response(refused.body(), status=409)
    try:
        await change_policy(
            redis, keys, new, who=_operator(request), why=_text(why), at=time.time()
        )
    except PolicyConflict as exc:
        return _error(409, str(exc))
    request.app[METRICS].policy_changes.labels("operator").inc()
    return web.json_response({"policy": new.to_dict(complete=True)})


_COUNT = re.compile(r"[1-9][0-9]{0,4}")


#: the policy parameters that take integers
_INTEGERS = frozenset(f.name for f in SCHEMA if f.allowed is not None and f.allowed.integer)


def _integers(changes: dict[str, Any]) -> dict[str, Any]:
    """JSON has one number type: `637.0` is the integer 637 (as JSON Schema, and so the OpenAPI
    document, reads it) for a parameter that takes integers; any other value is left to the
    core to judge."""
    return {
        name: int(value)
        if name in _INTEGERS and isinstance(value, float) and value.is_integer()
        else value
        for name, value in changes.items()
    }


def _count(request: web.Request, default: int) -> int | None:
    """`?count=N` of a list route (decimal digits, in [1, MAX_COUNT]), or `default` without one;
    None if it is anything else (a 400, on every list route alike)."""
    text = request.query.get("count")
    if text is None:
        return default
    if _COUNT.fullmatch(text) is None or int(text) > MAX_COUNT:
        return None
    return int(text)


BAD_COUNT = f"count must be an integer in [1, {MAX_COUNT}]"


@needs(READ)
async def policy_history(request: web.Request) -> web.Response:
    """The policy log, newest first (`?count=N`, default 100): each change's version, the policy
    it put in force, who (`X-Fedasync-Operator`, or the rule), why, and at (Unix seconds)."""
    count = _count(request, 100)
    if count is None:
        return _error(400, BAD_COUNT)
    entries = await policy_log(request.app[REDIS], request.app[KEYS], last=count)
    # the log records a policy without the fields at their elided defaults: shown complete,
    # as GET /v1/policy shows it
    for entry in entries:
        entry["policy"] = Policy.from_dict(entry["policy"]).to_dict(complete=True)
    return web.json_response(entries[::-1])


async def _budget(request: web.Request) -> BudgetSettings:
    """The budget that ends training: the aggregator's, as it recorded it at its start; this
    service's own only before the aggregator's first start (stores/run_record.py)."""
    recorded = await recorded_budget(request.app[REDIS], request.app[KEYS])
    return recorded if recorded is not None else request.app[SETTINGS].budget


async def budget_refusal(request: web.Request, new: Policy) -> web.Response | None:
    """409 for a budget change that cannot take effect as asked: training has ended (an end is
    final, a budget never reopens it), or the new budget is already used up (it would end
    training at once). None if the budget may change."""
    redis, keys = request.app[REDIS], request.app[KEYS]
    done: Any = await redis.hgetall(keys.done)
    if done:
        ended = {k.decode(): v.decode() for k, v in done.items()}
        return _error(
            409,
            f"training ended ({ended.get('reason', '?')} at version {ended.get('version', '?')}); "
            "a budget cannot reopen it",
            training_done=ended,
        )
    max_updates, max_seconds = (await _budget(request)).limits(new)
    version = await get_bytes(redis, keys.version)
    applied = int(version) if version is not None else 0
    if applied >= max_updates:
        return _error(
            409,
            f"max_updates {max_updates} is already used up: {applied} updates applied",
            field="max_updates",
            used=applied,
        )
    started = await get_bytes(redis, keys.started)
    elapsed = 0.0 if started is None else time.time() - float(started)
    if elapsed >= max_seconds:
        return _error(
            409,
            f"max_seconds {max_seconds:g} is already used up: {elapsed:.0f} s since training "
            "started",
            field="max_seconds",
            used=elapsed,
        )
    return None


@needs(READ)
async def get_switches(request: web.Request) -> web.Response:
    active: Any = await request.app[REDIS].hgetall(request.app[KEYS].switches)
    on = {k.decode(): json.loads(v) for k, v in active.items()}
    return web.json_response(
        {
            name: {"on": name in on, "description": switch.description, **on.get(name, {})}
            for name, switch in SWITCHES.items()
        }
    )


@needs(WRITE)
async def flip_switch(request: web.Request) -> web.Response:
    """Body: {"on": true|false, "reason": "..."}; a switch's change is a new policy version."""
    name = request.match_info["name"]
    if name not in SWITCHES:
        return _error(404, f"unknown switch {name!r}", known=sorted(SWITCHES))
    try:
        body = await _json_body(request)
    except BadBody as exc:
        return _error(exc.status, exc.message)
    if not isinstance(body, dict) or not isinstance(body.get("on"), bool):
        return _error(400, 'expected {"on": true|false, "reason": "..."}')
    reason = _text(body.get("reason", ""))
    who = _operator(request)
    try:
        new = await set_switch(
            request.app[REDIS], request.app[KEYS], name, body["on"], reason=reason, who=who
        )
    except (AlreadyInState, PolicyConflict) as exc:
        return _error(409, str(exc))
    request.app[METRICS].policy_changes.labels("operator").inc()
    return web.json_response(
        {"switch": name, "on": body["on"], "policy": new.to_dict(complete=True)}
    )


@needs(READ)
async def alerts(request: web.Request) -> web.Response:
    """The most recent alerts, newest first (`?count=N`, default 100)."""
    count = _count(request, 100)
    if count is None:
        return _error(400, BAD_COUNT)
    entries: Any = await request.app[REDIS].xrevrange(request.app[KEYS].alerts, count=count)
    return web.json_response([alert_record(entry_id, fields) for entry_id, fields in entries])


@needs(READ)
async def status(request: web.Request) -> web.Response:
    """Where training stands: versions, recent rate, τ and α, drops, per-client acceptance,
    backlog, active switches, and whether (and why) it is done."""
    redis, keys, window = request.app[REDIS], request.app[KEYS], request.app[WINDOW]
    await window.refresh(time.time())
    version = await get_bytes(redis, keys.version)
    policy = await read_policy(redis, keys)
    done: Any = await redis.hgetall(keys.done)
    switches: Any = await redis.hkeys(keys.switches)
    backlog = await read_backlog(redis, keys)
    evaluation = await evaluations.latest(redis, keys)
    max_updates, max_seconds = (await _budget(request)).limits(policy)
    started = await get_bytes(redis, keys.started)
    committed = int(version) if version is not None else None
    return web.json_response(
        {
            "version": committed,
            "policy_version": policy.version,
            "recent": window.summary(),
            "decisions": await redis.xlen(keys.ledger),
            "dead_letters": await redis.xlen(keys.deadletter),
            "stream_length": backlog.length,
            "pending": backlog.pending,
            "lag": backlog.lag,
            "switches_on": sorted(s.decode() for s in switches),
            # applied updates, read from the ledger: a FedBuff version takes K of them
            "budget_left_updates": None
            if committed is None
            else max(max_updates - window.totals["applied"], 0),
            "budget_left_seconds": None
            if started is None
            else max(max_seconds - (time.time() - float(started)), 0.0),
            "training_done": {k.decode(): v.decode() for k, v in done.items()} or None,
            "evaluation": None if evaluation is None else asdict(evaluation),
            # differential privacy: ε spent (from the ledger) and the policy's DP settings
            "privacy": privacy_status(policy, window.spent),
        }
    )


_DASHBOARD = (resources.files("fedasync.services.control") / "dashboard.html").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    """The operators' page; it loads nothing from any other host (the CSP forbids it)."""
    csp = "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'"
    return web.Response(
        body=_DASHBOARD, content_type="text/html", headers={"Content-Security-Policy": csp}
    )


async def metrics_endpoint(request: web.Request) -> web.Response:
    """The metrics even while Redis is away (they count its failures): the policy version gauge
    is refreshed when Redis answers and otherwise stays as it was."""
    metrics = request.app[METRICS]
    try:
        policy = await read_policy(request.app[REDIS], request.app[KEYS])
    except NoPolicy:
        pass
    except (*TRANSIENT, RedisError) as exc:
        log.debug("metrics: policy version not refreshed (%r)", exc)
    else:
        metrics.policy_version.set(policy.version)
    return metrics_response(metrics.registry)


@web.middleware
async def redis_answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What Redis cannot give is a 503 the client may retry, never a 500: no policy yet (the
    aggregator has not started), Redis unreachable or timed out, or an error reply.

    A write whose reply was lost may have been made all the same, so the answer to one says so:
    read the policy (or the switch) before repeating it, or the change is made twice (two
    versions with the same values: harmless, but a second entry in the history).
    """
    try:
        return await handler(request)
    except NoPolicy as exc:
        return _error(503, str(exc))
    except (*TRANSIENT, RedisError) as exc:
        kind = "redis" if isinstance(exc, ResponseError) else "connection"
        request.app[METRICS].redis_unavailable.labels(kind).inc()
        log.warning("%s %s: Redis failed (%r); answered 503", request.method, request.path, exc)
        message = f"Redis unavailable: {exc}"
        if request.method not in ("GET", "HEAD"):
            message += "; the change may have been made: read it back before repeating it"
        return web.json_response({"error": message}, status=503, headers={"Retry-After": "1"})


@needs(READ)
async def evaluation_curve(request: web.Request) -> web.Response:
    """The evaluator's records, oldest first: the accuracy curve, overall and per class."""
    count = _count(request, 500)
    if count is None:
        return _error(400, BAD_COUNT)
    records = await evaluations.recent(request.app[REDIS], request.app[KEYS], count)
    return web.json_response([asdict(r) for r in records])


async def readyz(request: web.Request) -> web.Response:
    """Ready once Redis answers: everything the service shows comes from there."""
    return await redis_readiness(request.app[REDIS], request.app[BACKGROUND])


async def _rules(app: web.Application) -> AsyncIterator[None]:
    """The automatic rules run beside the API; cancelled and awaited on shutdown."""
    stopping = asyncio.Event()
    runner = RuleRunner(
        app[SETTINGS].control, app[REDIS], app[KEYS], window=app[WINDOW], metrics=app[METRICS]
    )
    app[BACKGROUND].start(runner.run(stopping), "rules")
    yield
    stopping.set()
    await app[BACKGROUND].stop()


def create_app(
    settings: Settings, redis: aioredis.Redis, *, run_rules: bool = True
) -> web.Application:
    app = web.Application(middlewares=[json_errors, redis_answers])
    app[SETTINGS] = settings
    app[REDIS] = redis
    app[KEYS] = Keys(settings.redis.key_prefix)
    control = settings.control
    app[WINDOW] = LedgerWindow(redis, app[KEYS], control.window_s, control.fairness_decisions)
    app[METRICS] = ControlMetrics()
    app[REGISTRY] = app[METRICS].registry
    app[BACKGROUND] = Background()
    app.add_routes(
        [
            web.get("/v1/policy", get_policy),
            web.patch("/v1/policy", patch_policy),
            web.get("/v1/policy/history", policy_history),
            web.get("/v1/status", status),
            web.get("/v1/switches", get_switches),
            web.post("/v1/switches/{name}", flip_switch),
            web.get("/v1/alerts", alerts),
            web.get("/v1/evaluations", evaluation_curve),
            web.get("/", dashboard),
            web.get("/metrics", metrics_endpoint),
            web.get("/livez", livez),
            web.get("/readyz", readyz),
        ]
    )
    documented(app, spec())  # /openapi.json, and no query key it does not name
    # innermost, after the query check: the routes' declared access (`needs`), as each handler's
    # own first lines checked it before
    app.middlewares.append(token_checked(control))
    if run_rules:
        app.cleanup_ctx.append(_rules)
    return app
