"""Redis clients set up for this job.

Binary responses (payloads are msgpack), RESP2 pinned so replies have one shape, a socket timeout
above the longest blocking read, and no automatic re-send: redis-py would otherwise silently retry
a command after a connection error, and a commit must only ever be retried on purpose (see
services/aggregator/commit.py). The one retry policy: actions that are safe to repeat go through
`retrying`, which backs off, logs every attempt and gives up after a bounded number (except
while Redis refuses writes for want of memory: retried for as long as it lasts); actions
whose failure costs nothing but a figure (gauges, housekeeping) go through `best_effort`, which
tries once and logs, so they can never stop or hold up the work they describe.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fedasync.services.runtime.settings import RedisSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: no CLIENT SETINFO on connect: least-privilege users may not run it (stores/acl.py), and each
#: refusal would be noise in ACL LOG; redis-py < 7.1 turns it off through lib_name/lib_version
_NO_CLIENT_INFO: dict[str, Any] = (
    {"driver_info": None}
    if importlib.util.find_spec("redis.driver_info") is not None
    else {"lib_name": None, "lib_version": None}
)

#: errors after which a command may be repeated on a new connection
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
#: seconds between attempts while Redis refuses writes for want of memory
OOM_RETRY_S = 2.0


def is_out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write because `maxmemory` is reached (with `noeviction`): nothing was
    written, and the same write may be sent again once memory is freed. The one place this is
    recognised: redis-py raises OutOfMemoryError for the `-OOM` reply, and Redis 6.2 wraps the
    same refusal of a write inside a script in an `ERR Error running script` reply."""
    if isinstance(exc, OutOfMemoryError):
        return True
    return isinstance(exc, ResponseError) and "OOM command not allowed" in str(exc)


def connect(settings: RedisSettings, url: str | None = None) -> aioredis.Redis:
    """A client for `url` (or the configured one); nothing is sent until first use."""
    target = url or settings.url
    if not target:
        raise ValueError("no Redis URL: set FEDASYNC_REDIS__URL")
    return aioredis.Redis.from_url(
        target,
        protocol=2,
        decode_responses=False,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=30,
        **_NO_CLIENT_INFO,
    )


async def retrying(
    what: str,
    action: Callable[[], Awaitable[T]],
    settings: RedisSettings,
    stopping: asyncio.Event | None = None,
    on_oom: Callable[[BaseException], Awaitable[None]] | None = None,
) -> T:
    """Run an idempotent Redis action, reconnecting with backoff on transient errors.

    An out-of-memory refusal (`is_out_of_memory`) wrote nothing: it is logged as such, reported
    to `on_oom` (a metric, an alert) and retried every OOM_RETRY_S for as long as it lasts,
    never turned into an exit. Gives up at once when `stopping` is set: a service asked to stop
    must not sit out a backoff.
    """
    while True:
        try:
            return await _retrying_transient(what, action, settings, stopping)
        except ResponseError as exc:
            if not is_out_of_memory(exc) or (stopping is not None and stopping.is_set()):
                raise
            log.error(
                "redis %s refused: Redis is out of memory (maxmemory reached, nothing written); "
                "retrying every %.0f s until memory is freed (docs/operations.md, "
                '"Redis memory")',
                what,
                OOM_RETRY_S,
            )
            if on_oom is not None:
                await on_oom(exc)
            if stopping is None:
                await asyncio.sleep(OOM_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), OOM_RETRY_S)
            if stopping.is_set():
                raise


async def _retrying_transient(
    what: str,
    action: Callable[[], Awaitable[T]],
    settings: RedisSettings,
    stopping: asyncio.Event | None,
) -> T:
    # every error after which a command may be repeated, not only redis-py's own two
    errors: Any = TRANSIENT
    policy = Retry(ExponentialBackoff(cap=2.0, base=0.05), settings.reconnect_attempts, errors)

    async def failed(error: Exception) -> None:
        if stopping is not None and stopping.is_set():
            raise error
        log.warning("redis %s failed (%s); retrying", what, error)

    return await policy.call_with_retry(action, failed)


async def best_effort(what: str, action: Callable[[], Awaitable[T]]) -> T | None:
    """Run `action` once; on any Redis or network error log it and return None.

    For what must never stop a service's work: a gauge read, a trim the next commit repeats.
    Not for anything whose loss would lose a write someone relies on.
    """
    try:
        return await action()
    except (RedisError, OSError) as exc:
        log.warning("redis %s skipped (%s)", what, exc)
        return None


async def get_bytes(redis: aioredis.Redis, key: str) -> bytes | None:
    """GET for binary values (clients here never decode responses)."""
    value = await redis.get(key)
    if value is not None and not isinstance(value, bytes):
        raise TypeError(f"{key}: expected bytes, got {type(value).__name__}")
    return value


async def stream_entries(
    redis: aioredis.Redis, stream: str, *, after: str = "0-0", page: int = 1000
) -> AsyncIterator[tuple[str, dict[bytes, bytes]]]:
    """(entry id, fields) of `stream` after `after` (exclusive), oldest first, read page by page
    so a long stream is never held in one reply."""
    start = "(" + after
    while True:
        entries: Any = await redis.xrange(stream, min=start, max="+", count=page)
        for entry_id, fields in entries:
            yield as_text(entry_id), fields
        if len(entries) < page:
            return
        start = "(" + as_text(entries[-1][0])


def as_text(value: str | bytes) -> str:
    """A reply field as text, whether the client decodes replies or not."""
    return value.decode() if isinstance(value, bytes) else value
