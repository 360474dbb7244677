"""HTTP API of the snapshot service (docs/http-api.md): versioned, immutable models, cheaply.

The newest model lives in memory as bytes with a strong ETag, so `GET /v1/models/latest` is a
dictionary lookup, and an unchanged version costs a 304. A background task follows the
announced version (`{p}:announced`, set by the commit, or in durable mode once the replicas hold
the commit) by pub/sub, re-reading it whenever it (re)subscribes, so a missed message only delays,
never loses, a version, and wakes long-polls.

Versions only grow. Should Redis report a committed version below the newest one served (it
lost commits: a restore from an older backup, an AOF that lost its transactions, a failover), the
numbers it hands out from then on name other models than the ones devices already hold. The
service then raises an alert and a metric and stops following: it keeps serving what it holds in
memory, announces no version, refuses (503) what it would have to read from Redis, and `/readyz`
answers 503 with the reason, until it is restarted (docs/operations.md, "Redis moved back in
time").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import FAST_PATH, livez, redis_readiness
from fedasync.services.runtime.lifecycle import cancel_tasks
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT, get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.cache import ModelCache, Served, TooManyWaiters
from fedasync.services.snapshot.conditional import none_match
from fedasync.services.snapshot.fast import HotAnswers
from fedasync.services.snapshot.metrics import SnapshotMetrics
from fedasync.services.snapshot.openapi import spec
from fedasync.services.stores.alerts import VERSION_REGRESSED, try_add_alert
from fedasync.shared.continuity import regressed
from fedasync.shared.keys import Keys
from fedasync.shared.snapshot_protocol import (
    DONE_HEADER,
    LATEST_META_PATH,
    LATEST_PATH,
    MODEL_CONTENT_TYPE,
    SAFETENSORS_CONTENT_TYPE,
    VERSION_HEADER,
)

log = logging.getLogger(__name__)


SETTINGS = web.AppKey("settings", Settings)
REDIS = web.AppKey("redis", aioredis.Redis)
KEYS = web.AppKey("keys", Keys)
CACHE = web.AppKey("cache", ModelCache)
METRICS = web.AppKey("metrics", SnapshotMetrics)


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


def _send(request: web.Request, served: Served, route: str, immutable: bool) -> web.Response:
    cache, metrics = request.app[CACHE], request.app[METRICS]
    safetensors = request.query.get("format") == "safetensors"
    etag = _etag(served, safetensors)
    headers = _headers(served, cache.done, immutable, etag)
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


def _error(status: int, message: str, route: str, request: web.Request) -> web.Response:
    request.app[METRICS].requests.labels(route, str(status)).inc()
    if status == 400:  # bad input: counted above, and a line naming it
        log.info("400 for %s: %s", request.path_qs[:200], message)
    return web.json_response({"error": message}, status=status)


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


async def _long_poll(request: web.Request, route: str) -> Served | web.Response | None:
    """`?newer_than=N&wait=S`: the newest version once it is above N (waited for up to S
    seconds), or the answer instead of it (204 on timeout, 400, 503); None without newer_than.
    `wait` is checked either way: a query string is right or a 400, never ignored."""
    cache, settings = request.app[CACHE], request.app[SETTINGS]
    newer_than = request.query.get("newer_than")
    try:
        wait = float(request.query.get("wait", settings.snapshot.long_poll_max_s))
    except ValueError:
        wait = math.nan
    than = None
    if newer_than is not None:
        than = -1 if newer_than == "-1" else parse_version(newer_than)
    if (newer_than is not None and than is None) or not math.isfinite(wait):
        return _error(400, NOT_NEWER, route, request)
    if than is None:
        return None
    wait = max(0.0, min(wait, settings.snapshot.long_poll_max_s))
    try:
        served = await cache.wait_newer(than, wait)
    except TooManyWaiters as exc:
        response = _error(503, str(exc), route, request)
        response.headers["Retry-After"] = "1"
        return response
    if served is None:
        if cache.closing:
            return _error(503, "shutting down", route, request)
        request.app[METRICS].requests.labels(route, "204").inc()
        return web.Response(status=204, headers={"Cache-Control": "no-cache"})
    return served


async def latest(request: web.Request) -> web.StreamResponse:
    """The newest committed model; `?newer_than=N&wait=S` long-polls for a version above N."""
    cache = request.app[CACHE]
    polled = await _long_poll(request, "latest")
    if isinstance(polled, web.Response):
        return polled
    served = polled if polled is not None else cache.latest
    if served is None:
        return _error(503, "no model committed yet", "latest", request)
    return _send(request, served, "latest", immutable=False)


async def by_version(request: web.Request) -> web.StreamResponse:
    """A specific version: immutable, cacheable for ever; 404 once it is no longer kept."""
    version = parse_version(request.match_info["version"])
    if version is None:
        return _error(400, NOT_A_VERSION, "version", request)
    served = await _lookup(request, version, "version")
    if served is None:
        return _error(404, "version not kept", "version", request)
    return _send(request, served, "version", immutable=True)


async def latest_meta(request: web.Request) -> web.StreamResponse:
    """The newest version's metadata; `?newer_than=N&wait=S` long-polls as `latest` does (a
    poller that wants the version, not the weights)."""
    polled = await _long_poll(request, "meta")
    if isinstance(polled, web.Response):
        return polled
    served = polled if polled is not None else request.app[CACHE].latest
    if served is None:  # as `latest` itself: nothing is kept yet, or Redis is away
        return _error(503, "no model committed yet", "meta", request)
    return _meta(request, served)


async def meta(request: web.Request) -> web.StreamResponse:
    """JSON metadata (version, layout, sha256, size, created) without the weights."""
    version = parse_version(request.match_info["version"])
    if version is None:
        return _error(400, NOT_A_VERSION, "meta", request)
    served = await _lookup(request, version, "meta")
    if served is None:
        return _error(404, "version not kept", "meta", request)
    return _meta(request, served)


def _meta(request: web.Request, served: Served) -> web.Response:
    request.app[METRICS].requests.labels("meta", "200").inc()
    body = served.meta | {"etag": served.etag, "training_done": request.app[CACHE].done or None}
    return web.json_response(body, headers={VERSION_HEADER: str(served.version)})


async def _lookup(request: web.Request, version: int, route: str) -> Served | None:
    cache = request.app[CACHE]
    served = cache.get(version)
    if served is None and cache.frozen is not None:
        # Redis's model under this number may be another model than the one devices hold
        request.app[METRICS].requests.labels(route, "503").inc()
        body = {"error": f"only versions held in memory are served: {cache.frozen}"}
        raise web.HTTPServiceUnavailable(text=json.dumps(body), content_type="application/json")
    if served is None:
        try:
            raw = await get_bytes(request.app[REDIS], request.app[KEYS].model(version))
        except (*TRANSIENT, RedisError) as exc:
            # a version not held in memory needs Redis: unavailable for now, not a 500
            request.app[METRICS].requests.labels(route, "503").inc()
            log.warning("version %d: Redis failed (%r); answered 503", version, exc)
            body = {"error": f"Redis unavailable: {exc}"}
            raise web.HTTPServiceUnavailable(
                text=json.dumps(body), content_type="application/json", headers={"Retry-After": "1"}
            ) from None
        if raw is None:
            return None
        served = Served.from_bytes(raw)
        cache.remember(served)
    return served


async def readyz(request: web.Request) -> web.Response:
    """Ready once a model is held in memory and Redis answers; never again once Redis moved back
    in time (until a restart)."""
    cache = request.app[CACHE]
    if cache.frozen is not None:
        return web.json_response({"status": "version regressed", "error": cache.frozen}, status=503)
    if cache.latest is None:
        return web.json_response({"status": "no model yet"}, status=503)
    return await redis_readiness(request.app[REDIS], version=cache.latest.version)


async def metrics_endpoint(request: web.Request) -> web.Response:
    return metrics_response(request.app[METRICS].registry)


# ---------------------------------------------------------------------------------- following
async def refresh(app: web.Application) -> None:
    """Load the newest committed version (and the done flag) into the cache."""
    redis, keys, cache = app[REDIS], app[KEYS], app[CACHE]
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
        await _freeze(app, f"Redis reports {said}, below version {served} already served")
        return
    if announced is None or (served is not None and served >= announced and done == cache.done):
        return
    raw = await get_bytes(redis, keys.model(announced))
    if raw is None:
        log.warning("version %d announced but model missing", announced)
        return
    await cache.publish(Served.from_bytes(raw), done)
    app[METRICS].version.set(announced)


async def _freeze(app: web.Application, reason: str) -> None:
    """Redis lost commits: stop following, say so once (log, metric, alert)."""
    app[CACHE].freeze(reason)
    app[METRICS].regressed.set(1)
    log.error(
        "%s: Redis lost commits. Serving only the versions held in memory, announcing none, "
        '/readyz 503, until restarted; see docs/operations.md, "Redis moved back in time"',
        reason,
    )
    await try_add_alert(app[REDIS], app[KEYS], VERSION_REGRESSED, reason, time.time())


#: how long one pub/sub read waits: silence this long re-checks the done flag, and bounds how long
#: the follower can outlive a shutdown whose cancellation it never saw (below)
FOLLOW_READ_S = 1.0


async def follow(app: web.Application) -> None:
    """Follow commits by pub/sub; on any connection trouble, back off and resubscribe.

    It also ends on its own once the cache is closing, not only when cancelled: a cancellation
    that lands while redis-py's pub/sub read is timing out can be lost (seen with redis-py 8.1 on
    Python 3.11: the task went on reading and the service never finished stopping).
    """
    backoff = 0.1
    cache = app[CACHE]
    while not cache.closing:
        try:
            pubsub = app[REDIS].pubsub()
            async with pubsub:
                await pubsub.subscribe(app[KEYS].versions_channel)
                await refresh(app)  # whatever was committed while we were not listening
                backoff = 0.1
                while not cache.closing:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=FOLLOW_READ_S
                    )
                    # a message means a new version; silence re-checks the done flag
                    await refresh(app)
                    del message
        except asyncio.CancelledError:
            raise
        except TRANSIENT as exc:
            app[METRICS].follow_failures.labels("connection").inc()
            log.warning("lost Redis (%s); resubscribing in %.1f s", exc, backoff)
        except RedisError as exc:
            # an error reply (NOPERM after an ACL change, OOM, LOADING...): it may clear, and
            # the versions already held go on being served meanwhile
            app[METRICS].follow_failures.labels("redis").inc()
            log.error("Redis refused (%s); following again in %.1f s", exc, backoff)
        except Exception:
            # a bug or a stored model that does not decode: never stop following for good
            app[METRICS].follow_failures.labels("error").inc()
            log.exception("following versions failed; again in %.1f s", backoff)
        else:
            break
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


async def _release_long_polls(app: web.Application) -> None:
    """On shutdown, before the server waits for requests in flight: wake every long-poll.

    Otherwise a long-poll whose client has gone (aiohttp does not cancel its handler) would hold
    the shutdown for as long as it asked to wait.
    """
    await app[CACHE].close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(follow(app), name="snapshot-follow")
    yield
    await app[CACHE].close()  # the follower also ends by itself within FOLLOW_READ_S
    await cancel_tasks([task])  # waits for it, with a deadline: never forever


def create_app(settings: Settings, redis: aioredis.Redis, worker: int = 0) -> web.Application:
    """The snapshot app; `worker` names this process among those sharing the port (service.py)."""
    app = web.Application(middlewares=[json_errors])
    app[SETTINGS] = settings
    app[REDIS] = redis
    app[KEYS] = Keys(settings.redis.key_prefix)
    app[CACHE] = ModelCache(settings.snapshot.cache_versions, settings.snapshot.max_waiters)
    app[METRICS] = SnapshotMetrics()
    app[METRICS].worker.labels(str(worker)).set(1)
    app[REGISTRY] = app[METRICS].registry
    app[METRICS].waiters.set_function(lambda: app[CACHE].waiters)
    app[FAST_PATH] = HotAnswers(app[CACHE], app[METRICS])
    app.add_routes(
        [
            web.get(LATEST_PATH, latest),
            web.get(LATEST_META_PATH, latest_meta),
            web.get("/v1/models/{version}/meta", meta),
            web.get("/v1/models/{version}", by_version),
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
