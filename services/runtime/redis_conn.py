"""Redis clients set up for this job.

Binary responses (payloads are msgpack), RESP2 pinned so replies have one shape, a socket timeout
above the longest blocking read, and no automatic re-send: redis-py would otherwise silently retry
a command after a connection error, and a commit must only ever be retried on purpose (see
services/aggregator/commit.py). The one retry policy: actions that are safe to repeat go through
`retrying`, which backs off, logs every attempt and gives up after a bounded number (except
while Redis refuses writes for want of memory: retried for as long as it lasts); actions
whose failure costs nothing but a figure (gauges, housekeeping) go through `best_effort`, which
tries once and logs, so they can never stop or hold up the work they describe.

With Sentinels configured (`FEDASYNC_REDIS__SENTINELS`) the client asks them for the primary and
follows it across a failover (redis-py's Sentinel pool). What a failover does to a call in flight
is classified once, in the client every fedasync process connects with (fedasync.client.redis_link,
the device's too): besides a lost connection, the replies a server gives while it is being
demoted, promoted or cut off from its replicas (`FAILOVER_CODES`) become `FailoverError`, a
connection error, so every caller's `except TRANSIENT` and `retrying` treat them as transient and
the next attempt goes to whichever server is the primary by then. The client also hears of a
failover from the Sentinels themselves (`+switch-master`) and closes its connections to the
replaced primary at once, and checks that each new connection reaches a primary
(services/runtime/primary_watch.py): a primary that froze and comes back after the failover
finds nobody still writing to it. Durable mode (`FEDASYNC_REDIS__DURABLE_REPLICAS`; by default
on with Sentinels) is `replicated`: the write and a WAIT on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, ResponseError

from fedasync.client.redis_link import FAILOVER_CODES as FAILOVER_CODES
from fedasync.client.redis_link import HEALTH_CHECK_S, FailoverAware, client_options, connect_url
from fedasync.client.redis_link import TRANSIENT as TRANSIENT
from fedasync.client.redis_link import FailoverAwareConnection as FailoverAwareConnection
from fedasync.client.redis_link import FailoverAwareSSLConnection as FailoverAwareSSLConnection
from fedasync.client.redis_link import FailoverAwareUnixConnection as FailoverAwareUnixConnection
from fedasync.client.redis_link import FailoverError as FailoverError
from fedasync.client.redis_link import NotReplicated as NotReplicated
from fedasync.client.redis_link import as_text as as_text
from fedasync.client.redis_link import failover_reply as failover_reply
from fedasync.client.redis_link import is_out_of_memory as is_out_of_memory
from fedasync.client.redis_link import replicated as replicated
from fedasync.services.runtime.primary_watch import PrimaryWatch, hello_role
from fedasync.services.runtime.redis_cluster import connect_cluster
from fedasync.services.runtime.settings import RedisSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: seconds between attempts while Redis refuses writes for want of memory
OOM_RETRY_S = 2.0


class FailoverAwareSentinelConnection(FailoverAware, SentinelManagedConnection):
    """A connection to the primary the Sentinels name, which it checks is one (`is_primary`):
    a server demoted since they named it is refused as a failover, and asked about again."""

    async def connect_to(self, address: Any) -> None:
        await super().connect_to(address)  # type: ignore[no-untyped-call]
        await self.send_command("HELLO", "2")
        role = hello_role(await self.read_response())
        if role != "master":
            await self.disconnect()
            raise FailoverError(
                f"{self.host}:{self.port} answers as {role}, not as the primary the Sentinels "
                "named: asking them again"
            )


class WatchedSentinelPool(SentinelConnectionPool):
    """The pool of the primary's connections, closing those to a primary the Sentinels
    replaced as soon as they announce it (services/runtime/primary_watch.py)."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self.watch = PrimaryWatch(self)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.watch.ensure_started()
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


class SentinelRedis(aioredis.Redis):
    """The primary's client that also closes its connections to the Sentinels when it closes
    its pool (redis-py leaves those to the `Sentinel` object, which nobody else holds)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        owns = (
            self.auto_close_connection_pool
            if close_connection_pool is None
            else close_connection_pool
        )
        pool = self.connection_pool
        if owns and isinstance(pool, WatchedSentinelPool):
            await pool.watch.aclose()
        await super().aclose(close_connection_pool)
        if owns and isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def connect(settings: RedisSettings, url: str | None = None) -> aioredis.Redis:
    """A client for `url` (or the configured one), or for the primary the configured Sentinels
    name, or for the configured Redis Cluster (services/runtime/redis_cluster.py); nothing is
    sent until first use."""
    if settings.cluster is not None and url is None:
        return connect_cluster(settings)
    if settings.sentinels is not None and url is None:
        common = client_options(settings.socket_timeout_s, settings.connect_timeout_s)
        return _primary_of_sentinels(settings, common)
    target = url or settings.url
    if not target:
        raise ValueError("no Redis URL: set FEDASYNC_REDIS__URL (or FEDASYNC_REDIS__SENTINELS)")
    return connect_url(target, settings.socket_timeout_s, settings.connect_timeout_s)


def _primary_of_sentinels(settings: RedisSettings, common: dict[str, Any]) -> aioredis.Redis:
    """The client of the primary the Sentinels name, asking them again after each failover.

    The URL, if any, gives the primary's user, password and database; its host and port are not
    used. The Sentinels are asked as `sentinel_username` (their own users, docs/security.md)."""
    target = urlsplit(settings.url) if settings.url else None
    password = settings.sentinel_password
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        settings.sentinel_list,
        sentinel_kwargs={
            **common,
            "username": settings.sentinel_username,
            "password": None if password is None else password.get_secret_value(),
        },
    )
    database = (target.path.lstrip("/") if target else "") or "0"
    primary: aioredis.Redis = sentinel.master_for(
        settings.master_name,
        redis_class=SentinelRedis,
        connection_pool_class=WatchedSentinelPool,
        connection_class=FailoverAwareSentinelConnection,
        username=unquote(target.username) if target and target.username else None,
        password=unquote(target.password) if target and target.password else None,
        db=int(database),
        health_check_interval=HEALTH_CHECK_S,
        **common,
    )
    return primary


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


#: loop turns `until_sent` gives a command at most (redis-py's write under a socket timeout
#: takes four: `wait_for` runs it as a task of its own)
SEND_TURNS = 16


async def until_sent(task: asyncio.Task[Any]) -> None:
    """Let a task that sends a Redis command run until it waits for the reply (or ends).

    A task only created runs when the caller next yields to the loop; a caller about to do
    synchronous work (deciding a read) yields here first, so that the command is on the wire
    and Redis serves it during that work. A bounded number of turns: at worst the command
    goes out after the work, as it would have without this."""
    for _ in range(SEND_TURNS):
        if task.done() or _awaits_reply(task.get_coro()):
            return
        await asyncio.sleep(0)


def _awaits_reply(coro: Any) -> bool:
    """Whether `coro` is suspended in a connection's `read_response`: its command written."""
    while coro is not None and hasattr(coro, "cr_code"):
        if coro.cr_code.co_name == "read_response":
            return True
        coro = coro.cr_await
    return False


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
    redis: aioredis.Redis,
    stream: str,
    *,
    after: str = "0-0",
    until: str = "+",
    page: int = 1000,
) -> AsyncIterator[tuple[str, dict[bytes, bytes]]]:
    """(entry id, fields) of `stream` after `after` (exclusive) up to `until` (inclusive; `+`:
    the end), oldest first, read page by page so a long stream is never held in one reply."""
    start = "(" + after
    while True:
        entries: Any = await redis.xrange(stream, min=start, max=until, count=page)
        for entry_id, fields in entries:
            yield as_text(entry_id), fields
        if len(entries) < page:
            return
        start = "(" + as_text(entries[-1][0])
