"""HTTP API of the snapshot service (docs/http-api.md): versioned, immutable models, cheaply.

The newest model lives in memory as bytes with a strong ETag, so `GET /v1/models/latest` is a
dictionary lookup, and an unchanged version costs a 304. A background task follows the
announced version (`{p}:announced`, set by the commit, or in durable mode once the replicas hold
the commit) by pub/sub, re-reading it whenever it (re)subscribes, so a missed message only delays,
never loses, a version, and wakes long-polls.

Every run is served: the legacy routes (`/v1/models/...`) mean the default run, their twins
under `/v1/runs/{run}/models/...` the run they name, with the same answers (runs.py holds a
cache per run, made on the run's first request). One follower serves them all: one pub/sub
connection subscribed to every held run's versions channel, a refresh of a run when its
channel speaks, and of every run once a second (FOLLOW_READ_S), so one run's commits never
wake another run's long-polls, and a busy run never starves a quiet one's re-reads.

Versions only grow. Should Redis report a committed version below the newest one served (it
lost commits: a restore from an older backup, an AOF that lost its transactions, a failover), the
numbers it hands out from then on name other models than the ones devices already hold. The
service then raises an alert and a metric and stops following that run: it keeps serving what it
holds in memory, announces no version, refuses (503) what it would have to read from Redis, and
(for the default run) `/readyz` answers 503 with the reason, until it is restarted
(docs/operations.md, "Redis moved back in time").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler
from redis.exceptions import RedisError

from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import FAST_PATH, livez, redis_readiness
from fedasync.services.runtime.lifecycle import cancel_tasks
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_cluster import is_cluster
from fedasync.services.runtime.redis_conn import TRANSIENT, get_bytes
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.run_routes import RUN, KnownRuns, runs_middleware
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.cache import ModelCache, Served, TooManyWaiters
from fedasync.services.snapshot.conditional import none_match
from fedasync.services.snapshot.fast import HotAnswers
from fedasync.services.snapshot.metrics import SnapshotMetrics
from fedasync.services.snapshot.openapi import MODEL_META_PATH, run_route, spec
from fedasync.services.snapshot.runs import RunCaches, ServedRun, TooManyRuns
from fedasync.services.stores.alerts import VERSION_REGRESSED, try_add_alert
from fedasync.services.stores.runs import run_exists
from fedasync.shared.continuity import regressed
from fedasync.shared.keys import Keys
from fedasync.shared.snapshot_protocol import (
    DONE_HEADER,
    LATEST_META_PATH,
    LATEST_PATH,
    MODEL_CONTENT_TYPE,
    MODEL_PATH,
    SAFETENSORS_CONTENT_TYPE,
    VERSION_HEADER,
)

log = logging.getLogger(__name__)


SETTINGS = web.AppKey("settings", Settings)
REDIS = web.AppKey("redis", aioredis.Redis)
KEYS = web.AppKey("keys", Keys)
#: the default run's cache (the legacy routes')
CACHE = web.AppKey("cache", ModelCache)
METRICS = web.AppKey("metrics", SnapshotMetrics)
#: every run held (runs.py)
RUNS = web.AppKey("runs", RunCaches)
#: the Redis client of each run (the shared one on a single Redis)
CLIENTS = web.AppKey("clients", RunClients)


# ---------------------------------------------------------------------------------- handlers
def _etag(served: Served, safetensors: bool) -> str:
    """A strong ETag per representation: the safetensors file is other bytes than the message."""
    return served.etag[:-1] + '-safetensors"' if safetensors else served.etag


def _headers(served: Served, done: dict[str, str], immutable: bool, etag: str) -> dict[str, str]:
    headers = {
        "ETag": etag,
        VERSION_HEADER: str(served.version),
        "Cache-Control": "public, max-age=31536000, immutable" if immutable else "no-cache",
    }
    if done:
        headers[DONE_HEADER] = done.get("reason", "done")
    return headers


def _send(
    request: web.Request, run: ServedRun, served: Served, route: str, immutable: bool
) -> web.Response:
    metrics = run.metrics
    safetensors = request.query.get("format") == "safetensors"
    etag = _etag(served, safetensors)
    headers = _headers(served, run.cache.done, immutable, etag)
    if none_match(request.headers.get("If-None-Match", ""), etag):
        metrics.not_modified.inc()
        metrics.requests.labels(route, "304").inc()
        return web.Response(status=304, headers=headers)
    if safetensors:
        body, content_type = served.safetensors(), SAFETENSORS_CONTENT_TYPE
    else:
        body, content_type = served.body, MODEL_CONTENT_TYPE
    metrics.sent.inc(len(body))
    metrics.requests.labels(route, "200").inc()
    return web.Response(body=body, content_type=content_type, headers=headers)


def _error(
    status: int, message: str, route: str, request: web.Request, run: ServedRun
) -> web.Response:
    run.metrics.requests.labels(route, str(status)).inc()
    if status == 400:  # bad input: counted above, and a line naming it
        log.info("400 for %s: %s", request.path_qs[:200], message)
    return web.json_response({"error": message}, status=status)


def _unavailable(body: dict[str, str]) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(
        text=json.dumps(body), content_type="application/json", headers={"Retry-After": "1"}
    )


async def _run(request: web.Request) -> ServedRun:
    """The run the request is about (request[RUN]), held from now on; the first request for a
    run loads its newest version before it is answered, and any other request that comes
    meanwhile waits for that load (not a 503 for a run that has models)."""
    runs = request.app[RUNS]
    try:
        run, added = runs.open(request[RUN].id)
    except TooManyRuns as exc:
        raise _unavailable({"error": str(exc), "reason": exc.reason}) from None
    if added:
        try:
            await _refresh_one(request.app, run)
        finally:
            run.loaded.set()
    elif not run.loaded.is_set():
        await run.loaded.wait()
    return run


#: a version as a URL spells it: ASCII decimal digits, no sign, no leading zero (but "0"), no `_`
#: separators, at most 19 digits. One spelling per version, so an immutable, cached-for-ever
#: answer has one URL (int() would also take "-0", "+0", "0_0" and non-ASCII digits).
_VERSION = re.compile(r"0|[1-9][0-9]{0,18}")
_MAX_VERSION = 2**63 - 1
NOT_A_VERSION = 'a version is decimal digits (0-9) without sign or leading zeros, or "latest"'


def parse_version(text: str) -> int | None:
    """The version `text` spells canonically, or None."""
    if _VERSION.fullmatch(text) is None:
        return None
    version = int(text)
    return version if version <= _MAX_VERSION else None


NOT_NEWER = "newer_than must be a version or -1, and wait a number"


async def _long_poll(
    request: web.Request, run: ServedRun, route: str
) -> Served | web.Response | None:
    """`?newer_than=N&wait=S`: the newest version once it is above N (waited for up to S
    seconds), or the answer instead of it (204 on timeout, 400, 503); None without newer_than.
    `wait` is checked either way: a query string is right or a 400, never ignored."""
    cache, settings = run.cache, request.app[SETTINGS]
    newer_than = request.query.get("newer_than")
    try:
        wait = float(request.query.get("wait", settings.snapshot.long_poll_max_s))
    except ValueError:
        wait = math.nan
    than = None
    if newer_than is not None:
        than = -1 if newer_than == "-1" else parse_version(newer_than)
    if (newer_than is not None and than is None) or not math.isfinite(wait):
        return _error(400, NOT_NEWER, route, request, run)
    if than is None:
        return None
    wait = max(0.0, min(wait, settings.snapshot.long_poll_max_s))
    try:
        served = await cache.wait_newer(than, wait)
    except TooManyWaiters as exc:
        response = _error(503, str(exc), route, request, run)
        response.headers["Retry-After"] = "1"
        return response
    if served is None:
        if cache.closing:
            return _error(503, "shutting down", route, request, run)
        run.metrics.requests.labels(route, "204").inc()
        return web.Response(status=204, headers={"Cache-Control": "no-cache"})
    return served


async def latest(request: web.Request) -> web.StreamResponse:
    """The newest committed model; `?newer_than=N&wait=S` long-polls for a version above N."""
    run = await _run(request)
    polled = await _long_poll(request, run, "latest")
    if isinstance(polled, web.Response):
        return polled
    served = polled if polled is not None else run.cache.latest
    if served is None:
        return _error(503, "no model committed yet", "latest", request, run)
    return _send(request, run, served, "latest", immutable=False)


async def by_version(request: web.Request) -> web.StreamResponse:
    """A specific version: immutable, cacheable for ever; 404 once it is no longer kept."""
    run = await _run(request)
    version = parse_version(request.match_info["version"])
    if version is None:
        return _error(400, NOT_A_VERSION, "version", request, run)
    served = await _lookup(run, version, "version")
    if served is None:
        return _error(404, "version not kept", "version", request, run)
    return _send(request, run, served, "version", immutable=True)


async def latest_meta(request: web.Request) -> web.StreamResponse:
    """The newest version's metadata; `?newer_than=N&wait=S` long-polls as `latest` does (a
    poller that wants the version, not the weights)."""
    run = await _run(request)
    polled = await _long_poll(request, run, "meta")
    if isinstance(polled, web.Response):
        return polled
    served = polled if polled is not None else run.cache.latest
    if served is None:  # as `latest` itself: nothing is kept yet, or Redis is away
        return _error(503, "no model committed yet", "meta", request, run)
    return _meta(run, served)


async def meta(request: web.Request) -> web.StreamResponse:
    """JSON metadata (version, layout, sha256, size, created) without the weights."""
    run = await _run(request)
    version = parse_version(request.match_info["version"])
    if version is None:
        return _error(400, NOT_A_VERSION, "meta", request, run)
    served = await _lookup(run, version, "meta")
    if served is None:
        return _error(404, "version not kept", "meta", request, run)
    return _meta(run, served)


def _meta(run: ServedRun, served: Served) -> web.Response:
    run.metrics.requests.labels("meta", "200").inc()
    body = served.meta | {"etag": served.etag, "training_done": run.cache.done or None}
    return web.json_response(body, headers={VERSION_HEADER: str(served.version)})


async def _lookup(run: ServedRun, version: int, route: str) -> Served | None:
    cache = run.cache
    served = cache.get(version)
    if served is None and cache.frozen is not None:
        # Redis's model under this number may be another model than the one devices hold
        run.metrics.requests.labels(route, "503").inc()
        body = {"error": f"only versions held in memory are served: {cache.frozen}"}
        raise web.HTTPServiceUnavailable(text=json.dumps(body), content_type="application/json")
    if served is None:
        try:
            raw = await get_bytes(run.redis, run.keys.model(version))
        except (*TRANSIENT, RedisError) as exc:
            # a version not held in memory needs Redis: unavailable for now, not a 500
            run.metrics.requests.labels(route, "503").inc()
            log.warning("version %d: Redis failed (%r); answered 503", version, exc)
            raise _unavailable({"error": f"Redis unavailable: {exc}"}) from None
        if raw is None:
            return None
        served = Served.from_bytes(raw)
        cache.remember(served)
    return served


@web.middleware
async def redis_away(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Whether a named run exists is a Redis read (run_routes.KnownRuns): with Redis away, that
    is a 503 to retry, as any other answer that needs Redis, never a 500."""
    try:
        return await handler(request)
    except (*TRANSIENT, RedisError) as exc:
        log.warning("%s: Redis failed (%r); answered 503", request.path[:200], exc)
        return web.json_response(
            {"error": f"Redis unavailable: {exc}"}, status=503, headers={"Retry-After": "1"}
        )


async def readyz(request: web.Request) -> web.Response:
    """Ready once a model of the default run is held in memory and Redis answers; never again
    once Redis moved back in time (until a restart)."""
    cache = request.app[CACHE]
    if cache.frozen is not None:
        return web.json_response({"status": "version regressed", "error": cache.frozen}, status=503)
    if cache.latest is None:
        return web.json_response({"status": "no model yet"}, status=503)
    key = Keys(request.app[SETTINGS].redis.key_prefix).state  # the default run's node
    return await redis_readiness(request.app[REDIS], key=key, version=cache.latest.version)


async def metrics_endpoint(request: web.Request) -> web.Response:
    return metrics_response(request.app[METRICS].registry)


# ---------------------------------------------------------------------------------- following
async def refresh(app: web.Application, run: ServedRun | None = None) -> None:
    """Load the newest committed version (and the done flag) of `run` (the default run for
    None) into its cache; one refresh of a run at a time (runs.py)."""
    run = run if run is not None else app[RUNS].default
    async with run.lock:
        await _refresh(app, run)


async def _refresh(app: web.Application, run: ServedRun) -> None:
    redis, keys, cache = run.redis, run.keys, run.cache
    if cache.frozen is not None:
        return
    # one read: the version committed and the one announced (they differ only in durable mode,
    # between a commit and its confirmation on the replicas; absent: data of an earlier release)
    committed_raw, announced_raw = await redis.mget([keys.version, keys.announced])
    done_raw: Any = await redis.hgetall(keys.done)
    done = {k.decode(): v.decode() for k, v in done_raw.items()}
    reported = None if committed_raw is None else int(committed_raw)
    announced = reported if announced_raw is None else int(announced_raw)
    served = None if cache.latest is None else cache.latest.version
    if regressed(served, reported):
        said = "no version" if reported is None else f"version {reported}"
        await _freeze(run, f"Redis reports {said}, below version {served} already served")
        return
    if announced is None or (served is not None and served >= announced and done == cache.done):
        return
    raw = await get_bytes(redis, keys.model(announced))
    if raw is None:
        log.warning("run %s: version %d announced but model missing", run.id, announced)
        return
    await cache.publish(Served.from_bytes(raw), done)
    run.metrics.version.set(announced)


async def _refresh_one(app: web.Application, run: ServedRun) -> None:
    """`refresh`, its failure counted and logged for this run alone: one run's trouble (an
    error reply, its primary away on a cluster) neither stops nor delays the others."""
    try:
        await refresh(app, run)
    except asyncio.CancelledError:
        raise
    except TRANSIENT as exc:
        run.metrics.follow_failures.labels("connection").inc()
        log.warning("run %s: lost Redis (%s); read again within %.0f s", run.id, exc, FOLLOW_READ_S)
    except RedisError as exc:
        # an error reply (NOPERM after an ACL change, OOM, LOADING...): it may clear, and the
        # versions already held go on being served meanwhile
        run.metrics.follow_failures.labels("redis").inc()
        log.error(
            "run %s: Redis refused (%s); read again within %.0f s", run.id, exc, FOLLOW_READ_S
        )
    except Exception:
        # a bug or a stored model that does not decode: never stop following for good
        run.metrics.follow_failures.labels("error").inc()
        log.exception("run %s: reading its newest version failed; again within 1 s", run.id)


async def _freeze(run: ServedRun, reason: str) -> None:
    """Redis lost commits: stop following, say so once (log, metric, alert)."""
    run.cache.freeze(reason)
    run.metrics.regressed.set(1)
    log.error(
        "run %s: %s: Redis lost commits. Serving only the versions held in memory, announcing "
        'none, /readyz 503 (default run), until restarted; see docs/operations.md, "Redis moved '
        'back in time"',
        run.id,
        reason,
    )
    await try_add_alert(run.redis, run.keys, VERSION_REGRESSED, reason, time.time())


#: how long one pub/sub read waits, and how often every run held is read again whatever its
#: channel said: silence this long re-checks the done flag, and bounds how long the follower
#: can outlive a shutdown whose cancellation it never saw (below)
FOLLOW_READ_S = 1.0


def _channel_name(message: dict[str, Any]) -> str:
    channel = message.get("channel", b"")
    return channel.decode() if isinstance(channel, bytes) else str(channel)


async def follow(app: web.Application) -> None:
    """Follow every held run's commits by pub/sub; on connection trouble, back off and
    resubscribe.

    One connection (the shared client's) subscribes to each run's versions channel, a run
    added later as soon as the loop sees it (`RunCaches.added`, within FOLLOW_READ_S). A
    message refreshes its run; every run is refreshed once a second whatever the channels say,
    so a message missed (or sent before a subscription) only delays a version.

    It also ends on its own once closing, not only when cancelled: a cancellation that lands
    while redis-py's pub/sub read is timing out can be lost (seen with redis-py 8.1 on Python
    3.11: the task went on reading and the service never finished stopping).
    """
    backoff = 0.1
    runs = app[RUNS]
    loop = asyncio.get_running_loop()
    while not runs.closing:
        try:
            if is_cluster(app[REDIS]):
                # a cluster's pub/sub connects to the node of its first channel's slot, from
                # the slot map its client holds: learn it first (nothing else in this service
                # uses the shared client, each run having its own)
                await app[REDIS].initialize()
            pubsub = app[REDIS].pubsub()
            async with pubsub:
                channels: dict[str, ServedRun] = {}
                runs.added.clear()
                await _subscribe(pubsub, runs, channels)
                await _refresh_all(app, channels.values())  # what was committed unheard
                backoff = 0.1
                every = loop.time() + FOLLOW_READ_S
                while not runs.closing:
                    if runs.added.is_set():
                        runs.added.clear()
                        await _refresh_all(app, await _subscribe(pubsub, runs, channels))
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=FOLLOW_READ_S
                    )
                    if message is not None:  # a new version of that run
                        named = channels.get(_channel_name(message))
                        if named is not None:
                            await _refresh_one(app, named)
                    if message is None or loop.time() >= every:
                        await _refresh_all(app, channels.values())
                        every = loop.time() + FOLLOW_READ_S
        except asyncio.CancelledError:
            raise
        except TRANSIENT as exc:
            for run in runs:
                run.metrics.follow_failures.labels("connection").inc()
            log.warning("lost Redis (%s); resubscribing in %.1f s", exc, backoff)
        except RedisError as exc:
            # an error reply to SUBSCRIBE (NOPERM after an ACL change...): it may clear, and
            # the versions already held go on being served meanwhile
            for run in runs:
                run.metrics.follow_failures.labels("redis").inc()
            log.error("Redis refused (%s); following again in %.1f s", exc, backoff)
        except Exception:
            for run in runs:
                run.metrics.follow_failures.labels("error").inc()
            log.exception("following versions failed; again in %.1f s", backoff)
        else:
            break
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


async def _subscribe(
    pubsub: Any, runs: RunCaches, channels: dict[str, ServedRun]
) -> list[ServedRun]:
    """Subscribe to the channel of every held run not yet subscribed; those runs."""
    new = [run for run in runs if run.keys.versions_channel not in channels]
    if new:
        await pubsub.subscribe(*(run.keys.versions_channel for run in new))
        channels.update((run.keys.versions_channel, run) for run in new)
    return new


async def _refresh_all(app: web.Application, runs: Iterable[ServedRun]) -> None:
    for run in list(runs):
        await _refresh_one(app, run)


async def _release_long_polls(app: web.Application) -> None:
    """On shutdown, before the server waits for requests in flight: wake every long-poll.

    Otherwise a long-poll whose client has gone (aiohttp does not cancel its handler) would hold
    the shutdown for as long as it asked to wait.
    """
    await app[RUNS].close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(follow(app), name="snapshot-follow")
    yield
    await app[RUNS].close()  # the follower also ends by itself within FOLLOW_READ_S
    await cancel_tasks([task])  # waits for it, with a deadline: never forever
    await app[CLIENTS].aclose()


def create_app(settings: Settings, redis: aioredis.Redis, worker: int = 0) -> web.Application:
    """The snapshot app; `worker` names this process among those sharing the port (service.py)."""
    clients = RunClients(redis, settings.redis, settings.redis.key_prefix)
    known = KnownRuns(clients, run_exists)
    app = web.Application(middlewares=[json_errors, redis_away, runs_middleware(known)])
    app[SETTINGS] = settings
    app[REDIS] = redis
    app[CLIENTS] = clients
    app[KEYS] = Keys(settings.redis.key_prefix)
    app[METRICS] = metrics = SnapshotMetrics(settings.redis.key_prefix)
    app[RUNS] = runs = RunCaches(clients, settings.snapshot, metrics)
    runs.default.loaded.set()  # the follower loads it; requests before that are 503s, as ever
    app[CACHE] = runs.default.cache
    metrics.worker.labels(str(worker)).set(1)
    app[REGISTRY] = metrics.registry
    app[FAST_PATH] = HotAnswers(runs)
    handlers = {
        LATEST_PATH: latest,
        LATEST_META_PATH: latest_meta,
        MODEL_META_PATH: meta,
        MODEL_PATH: by_version,
    }
    # each legacy route (the default run) and its twin for a named run, the fixed paths first
    routes = [
        web.get(path, h)
        for legacy, h in handlers.items()
        for path in (legacy, run_route(legacy, pattern=True))
    ]
    app.add_routes(
        [
            *routes,
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
        ]
    )
    documented(app, spec())  # /openapi.json, and no query key it does not name
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(_release_long_polls)
    return app


async def wait_ready(app: web.Application, timeout: float = 10.0) -> None:
    """For tests and the launcher: return once the first model is in memory."""
    if await app[CACHE].wait_newer(-1, timeout) is None:
        raise TimeoutError(f"snapshot service has no model after {timeout} s")
