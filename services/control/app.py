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
from pydantic import ValidationError
from redis.exceptions import RedisError, ResponseError

from fedasync.services.control.auth import READ, WRITE, needs, token_checked
from fedasync.services.control.metrics import ControlMetrics
from fedasync.services.control.openapi import MAX_COUNT, spec, twin
from fedasync.services.control.privacy import PRIVACY_FIELDS, privacy_refusal, privacy_status
from fedasync.services.control.rules_runner import RuleRunner, RunsRules
from fedasync.services.control.switchboard import AlreadyInState, set_switch
from fedasync.services.control.window import LedgerWindow, RunWindows
from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import BACKGROUND, livez, redis_readiness
from fedasync.services.runtime.lifecycle import Background
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT, get_bytes
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.run_routes import RUN, KnownRuns, runs_middleware
from fedasync.services.runtime.settings import (
    BudgetSettings,
    PolicySettings,
    Settings,
    TaskSettings,
)
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
from fedasync.services.stores.runs import create_run, list_runs, read_spec, run_exists, run_status
from fedasync.shared.keys import Keys
from fedasync.shared.params import Conflict, ParamError
from fedasync.shared.policy import POLICY_RANGES, SCHEMA, Policy
from fedasync.shared.runs import BAD_RUN_ID, RUN_EXISTS, RunIdError, RunSpec, run_base
from fedasync.shared.switches import SWITCHES

SETTINGS = web.AppKey("settings", Settings)
REDIS = web.AppKey("redis", aioredis.Redis)
KEYS = web.AppKey("keys", Keys)
WINDOW = web.AppKey("window", LedgerWindow)
WINDOWS = web.AppKey("windows", RunWindows)
CLIENTS = web.AppKey("clients", RunClients)
KNOWN = web.AppKey("known", KnownRuns)
METRICS = web.AppKey("metrics", ControlMetrics)

#: the reason of a run route's 409 for a run whose aggregator has not started (no policy yet)
NOT_STARTED = "not_started"

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


def _at(request: web.Request) -> tuple[aioredis.Redis, Keys]:
    """The client and keys of the run the request is about (run_routes.runs_middleware): the
    default run's on a legacy route, the named run's on its twin."""
    run = request[RUN]
    return run.redis, run.keys


def _window(request: web.Request) -> LedgerWindow:
    """The ledger window of the request's run (the service's own for the default run)."""
    run = request[RUN]
    return request.app[WINDOWS].of(run.id, run.redis)


@needs(READ)
async def get_policy(request: web.Request) -> web.Response:
    policy = await read_policy(*_at(request))
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
    return await _change(request, changes, why)


async def _change(
    request: web.Request, changes: dict[str, Any], why: str, current: Policy | None = None
) -> web.Response:
    """Put `changes` in force for the request's run through the one path every change takes:
    the core's rules (names, types, ranges, what may not change back), the budget and privacy
    checks, then a new policy version with who and why (stores/policy_store.py)."""
    redis, keys = _at(request)
    current = await read_policy(redis, keys) if current is None else current
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
        window = _window(request)
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
    entries = await policy_log(*_at(request), last=count)
    # the log records a policy without the fields at their elided defaults: shown complete,
    # as GET /v1/policy shows it
    for entry in entries:
        entry["policy"] = Policy.from_dict(entry["policy"]).to_dict(complete=True)
    return web.json_response(entries[::-1])


async def _budget(request: web.Request) -> BudgetSettings:
    """The budget that ends training: the aggregator's, as it recorded it at its start; this
    service's own only before the aggregator's first start (stores/run_record.py)."""
    recorded = await recorded_budget(*_at(request))
    return recorded if recorded is not None else request.app[SETTINGS].budget


async def budget_refusal(request: web.Request, new: Policy) -> web.Response | None:
    """409 for a budget change that cannot take effect as asked: training has ended (an end is
    final, a budget never reopens it), or the new budget is already used up (it would end
    training at once). None if the budget may change."""
    redis, keys = _at(request)
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
    active: Any = await request[RUN].redis.hgetall(request[RUN].keys.switches)
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
        new = await set_switch(*_at(request), name, body["on"], reason=reason, who=who)
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
    entries: Any = await request[RUN].redis.xrevrange(request[RUN].keys.alerts, count=count)
    return web.json_response([alert_record(entry_id, fields) for entry_id, fields in entries])


@needs(READ)
async def status(request: web.Request) -> web.Response:
    """Where training stands: versions, recent rate, τ and α, drops, per-client acceptance,
    backlog, active switches, and whether (and why) it is done."""
    redis, keys, window = *_at(request), _window(request)
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


def _refused(status: int, reason: str, message: str, **extra: Any) -> web.Response:
    """The `{"error", "reason"}` answer of the runs routes (as run_routes.refusal)."""
    return web.json_response({"error": message, "reason": reason, **extra}, status=status)


def _first_problem(exc: ValueError) -> str:
    """One line for a refused spec: pydantic's first error, or the exception's own text."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(exc)


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _whole_numbers(body: dict[str, Any]) -> dict[str, Any]:
    """`637.0` is the integer 637 where a spec takes an integer (as `_integers` for a policy
    change, and as JSON Schema reads it): the task's seed and fleet, the budget's updates and
    the start policy's integer fields."""
    out = dict(body)
    for name, fields in (("task", ("seed", "num_devices")), ("budget", ("max_updates",))):
        table = out.get(name)
        if isinstance(table, dict):
            out[name] = {k: _whole(v) if k in fields else v for k, v in table.items()}
    if isinstance(out.get("policy"), dict):
        out["policy"] = _integers(out["policy"])
    return out


def _new_spec(body: Any, who: str) -> RunSpec:
    """The spec a POST /v1/runs body asks for, checked as the run's settings will be (task,
    start policy, budget); RunIdError, Conflict or ValueError naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("a run is a JSON object: {id, task, policy, budget}")
    filled = {"created_at", "created_by"} & set(body)
    if filled:
        raise ValueError(f"{', '.join(sorted(filled))}: set by the service, not the request")
    spec = RunSpec.from_dict({**_whole_numbers(body), "created_at": time.time(), "created_by": who})
    task = {k: v for k, v in spec.task.to_dict().items() if v is not None}
    try:
        TaskSettings.model_validate(task)
        BudgetSettings.model_validate(spec.budget)
    except ValidationError as exc:
        raise ValueError(_first_problem(exc)) from None
    try:  # a Conflict (fields that cannot go together) is raised as it is: a 409
        Policy.configured(spec.policy)
        PolicySettings.model_validate(spec.policy).to_policy()
    except Conflict:
        raise
    except ParamError as exc:
        raise ValueError(f"policy: {exc}") from None
    except ValidationError as exc:
        raise ValueError(f"policy: {_first_problem(exc)}") from None
    return spec


async def run_view(clients: RunClients, run: str, *, with_spec: bool) -> dict[str, Any]:
    """Where a run stands, from its own keys: status, version, why it is done (and its spec)."""
    redis, keys = clients.for_run(run), Keys(run)
    state = await run_status(redis, keys)
    version = await get_bytes(redis, keys.version)
    done: Any = await redis.hgetall(keys.done)
    view: dict[str, Any] = {
        "id": run,
        "status": state.value,
        "version": None if version is None else int(version),
        "training_done": {k.decode(): v.decode() for k, v in done.items()} or None,
    }
    if with_spec:
        try:
            spec = await read_spec(redis, run)
        except ValueError as exc:  # written by something else: shown as absent, never a 500
            log.warning("run %s: its stored spec cannot be read (%s)", run, exc)
            spec = None
        view["spec"] = None if spec is None else spec.to_dict()
    return view


@needs(WRITE)
async def post_run(request: web.Request) -> web.Response:
    """Create a run from a RunSpec (without created_at/created_by, which are filled in here)."""
    try:
        body = await _json_body(request)
    except BadBody as exc:
        return _refused(exc.status, "bad_body", exc.message)
    try:
        spec = _new_spec(body, _operator(request))
    except RunIdError as exc:
        return _refused(400, BAD_RUN_ID, str(exc))
    except Conflict as exc:  # start fields that cannot go together (shared/policy.py)
        return _refused(409, "conflict", str(exc), field=exc.param, allowed=exc.allowed)
    except ValueError as exc:
        return _refused(400, "bad_spec", str(exc))
    clients = request.app[CLIENTS]
    redis = clients.for_run(spec.id)
    taken = f"a run {spec.id!r} exists"
    if spec.id == clients.default or await run_exists(redis, spec.id):
        return _refused(409, RUN_EXISTS, taken)
    if not await create_run(redis, spec):
        return _refused(409, RUN_EXISTS, taken)
    request.app[KNOWN].learn(spec.id)
    log.info("run %s created by %s", spec.id, spec.created_by)
    view = await run_view(clients, spec.id, with_spec=True)
    return web.json_response(view, status=201, headers={"Location": run_base(spec.id)})


@needs(READ)
async def get_runs(request: web.Request) -> web.Response:
    """Every run (the default first) and where each stands."""
    clients = request.app[CLIENTS]
    runs = await list_runs(clients.shared, clients.default)
    return web.json_response(
        {"runs": [await run_view(clients, run, with_spec=False) for run in runs]}
    )


@needs(READ)
async def get_run(request: web.Request) -> web.Response:
    return web.json_response(await run_view(request.app[CLIENTS], request[RUN].id, with_spec=True))


async def _action_body(request: web.Request, shape: str) -> dict[str, Any] | web.Response:
    try:
        body = await _json_body(request)
    except BadBody as exc:
        return _refused(exc.status, "bad_body", exc.message)
    if not isinstance(body, dict):
        return _refused(400, "bad_body", f"expected {shape}")
    return body


@needs(WRITE)
async def pause_run(request: web.Request) -> web.Response:
    """Body: {"on": true|false, "why": "..."}: pause or resume the run's aggregation."""
    shape = '{"on": true|false, "why": "..."}'
    body = await _action_body(request, shape)
    if isinstance(body, web.Response):
        return body
    on, why = body.get("on"), body.get("why", "")
    if not isinstance(on, bool) or not isinstance(why, str):
        return _refused(400, "bad_body", f"expected {shape}")
    current = await read_policy(*_at(request))
    if current.paused is on:
        state = "paused" if on else "not paused"
        return _refused(409, "already", f"run {request[RUN].id!r} is {state} already")
    said = f"{'pause' if on else 'resume'}: {why}" if why else ("pause" if on else "resume")
    return await _change(request, {"paused": on}, said, current)


@needs(WRITE)
async def stop_run(request: web.Request) -> web.Response:
    """Body: {"reason": "..."}: stop the run for good (policy.stopped, which cannot be undone);
    its aggregator closes it with reason "stopped" at its next batch."""
    shape = '{"reason": "..."}'
    body = await _action_body(request, shape)
    if isinstance(body, web.Response):
        return body
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        return _refused(400, "bad_body", f"expected {shape}")
    redis, keys = _at(request)
    done: Any = await redis.hgetall(keys.done)
    if done:
        ended = {k.decode(): v.decode() for k, v in done.items()}
        message = f"training ended already ({ended.get('reason', '?')})"
        return _refused(409, "training_done", message, training_done=ended)
    current = await read_policy(redis, keys)
    if current.stopped:
        return _refused(409, "already", f"run {request[RUN].id!r} is stopped already")
    return await _change(
        request, {"stopped": True}, f"stop: {reason}" if reason else "stop", current
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

    On the routes of a run other than the default one, no policy yet is a 409 (`not_started`):
    the run exists, created through the API, and its aggregator has not started.

    A write whose reply was lost may have been made all the same, so the answer to one says so:
    read the policy (or the switch) before repeating it, or the change is made twice (two
    versions with the same values: harmless, but a second entry in the history).
    """
    try:
        return await handler(request)
    except NoPolicy as exc:
        run = request.get(RUN)
        # a run created, its aggregator not started (the default run answers as it always did,
        # by its legacy routes and its twins alike)
        if run is not None and run.id != request.app[CLIENTS].default:
            return _refused(409, NOT_STARTED, f"run {run.id!r} has not started: {exc}")
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
    records = await evaluations.recent(*_at(request), count)
    return web.json_response([asdict(r) for r in records])


async def readyz(request: web.Request) -> web.Response:
    """Ready once Redis answers: everything the service shows comes from there."""
    key = request.app[KEYS].state  # the default run's node, on a cluster
    return await redis_readiness(request.app[REDIS], request.app[BACKGROUND], key=key)


async def _rules(app: web.Application) -> AsyncIterator[None]:
    """The automatic rules run beside the API; cancelled and awaited on shutdown."""
    stopping = asyncio.Event()
    runner = RuleRunner(
        app[SETTINGS].control, app[REDIS], app[KEYS], window=app[WINDOW], metrics=app[METRICS]
    )
    others = RunsRules(app[SETTINGS].control, app[CLIENTS], app[WINDOWS], app[METRICS])

    async def both() -> None:
        # one background task (the one /readyz vouches for and shutdown cancels): the default
        # run's rules and the other runs' side by side
        await asyncio.gather(runner.run(stopping), others.run(stopping))

    app[BACKGROUND].start(both(), "rules")
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
    app[CLIENTS] = RunClients(redis, settings.redis, settings.redis.key_prefix)
    app[KNOWN] = KnownRuns(app[CLIENTS], run_exists)
    app[WINDOWS] = RunWindows(
        app[WINDOW], settings.redis.key_prefix, control.window_s, control.fairness_decisions
    )
    # every /v1 route serves the default run, and again under /v1/runs/{run}/ the run named
    runs_routes = [
        (web.get, "/v1/policy", get_policy),
        (web.patch, "/v1/policy", patch_policy),
        (web.get, "/v1/policy/history", policy_history),
        (web.get, "/v1/status", status),
        (web.get, "/v1/switches", get_switches),
        (web.post, "/v1/switches/{name}", flip_switch),
        (web.get, "/v1/alerts", alerts),
        (web.get, "/v1/evaluations", evaluation_curve),
    ]
    app.add_routes([make(path, handler) for make, path, handler in runs_routes])
    app.add_routes([make(twin(path), handler) for make, path, handler in runs_routes])
    app.add_routes(
        [
            web.post("/v1/runs", post_run),
            web.get("/v1/runs", get_runs),
            web.get("/v1/runs/{run}", get_run),
            web.post("/v1/runs/{run}/pause", pause_run),
            web.post("/v1/runs/{run}/stop", stop_run),
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
    # after the token: a run's existence is not told to a request that may not read
    app.middlewares.append(runs_middleware(app[KNOWN]))
    if run_rules:
        app.cleanup_ctx.append(_rules)
    return app
