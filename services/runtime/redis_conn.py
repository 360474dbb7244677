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
is classified here, once: besides a lost connection, the replies a server gives while it is being
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
import importlib.util
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fedasync.services.runtime.primary_watch import PrimaryWatch, hello_role
from fedasync.services.runtime.settings import Durability, RedisSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

#: no CLIENT SETINFO on connect: least-privilege users may not run it (stores/acl.py), and each
#: refusal would be noise in ACL LOG; redis-py < 7.1 turns it off through lib_name/lib_version
_NO_CLIENT_INFO: dict[str, Any] = (
    {"driver_info": None}
    if importlib.util.find_spec("redis.driver_info") is not None
    else {"lib_name": None, "lib_version": None}
)

#: error codes of the replies a server gives while a failover moves the primary: written to a
#: demoted primary (READONLY), a primary short of the replicas `min-replicas-to-write` asks for
#: (NOREPLICAS), a replica cut off from its primary (MASTERDOWN), a blocked read ended by the
#: server's change of role (UNBLOCKED), a server still loading its data after a restart (LOADING)
FAILOVER_CODES = frozenset({"READONLY", "NOREPLICAS", "MASTERDOWN", "UNBLOCKED", "LOADING"})


class FailoverError(RedisConnectionError):
    """The server answered, but as a server that is not (or not yet, or no longer) a primary
    that can take this command: repeat it, on whichever server is the primary by then."""


class NotReplicated(FailoverError):
    """Durable mode: WAIT ended with fewer replicas holding the write than asked for. The write
    is on the primary and may yet reach them, or be lost with it: repeat the action."""


#: errors after which a command may be repeated on a new connection (FailoverError among them)
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


def failover_reply(error: ResponseError) -> bool:
    """`error` is a reply of a server caught in a failover (`FAILOVER_CODES`).

    redis-py names some codes by class and drops them from the text (READONLY, MASTERDOWN,
    LOADING); the others, and errors a script's `redis.call` raised, keep them in the text."""
    code = getattr(error, "status_code", None) or str(error).split(" ", 1)[0]
    return code in FAILOVER_CODES


class _FailoverAware(AbstractConnection):
    """Turns a failover reply into `FailoverError` and drops the connection, so the next use
    connects afresh (with Sentinel: to the primary it names then)."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not failover_reply(exc):
                raise
            await self.disconnect()
            raise FailoverError(f"{exc} (a failover: the command may be repeated)") from exc


class FailoverAwareConnection(_FailoverAware, Connection):
    pass


class FailoverAwareSSLConnection(_FailoverAware, SSLConnection):
    pass


class FailoverAwareUnixConnection(_FailoverAware, UnixDomainSocketConnection):
    pass


class FailoverAwareSentinelConnection(_FailoverAware, SentinelManagedConnection):
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


_FAILOVER_AWARE: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: FailoverAwareConnection,
    SSLConnection: FailoverAwareSSLConnection,
    UnixDomainSocketConnection: FailoverAwareUnixConnection,
}


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
    name; nothing is sent until first use."""
    common: dict[str, Any] = {
        "protocol": 2,
        "decode_responses": False,
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        **_NO_CLIENT_INFO,
    }
    if settings.sentinels is not None and url is None:
        return _primary_of_sentinels(settings, common)
    target = url or settings.url
    if not target:
        raise ValueError("no Redis URL: set FEDASYNC_REDIS__URL (or FEDASYNC_REDIS__SENTINELS)")
    client = aioredis.Redis.from_url(target, health_check_interval=30, **common)
    pool = client.connection_pool
    pool.connection_class = _FAILOVER_AWARE.get(pool.connection_class, pool.connection_class)
    return client


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
        health_check_interval=30,
        **common,
    )
    return primary


async def replicated(
    redis: aioredis.Redis,
    durability: Durability,
    write: Callable[[aioredis.Redis], Awaitable[T]],
) -> T:
    """Run `write` and, in durable mode, return only once WAIT says `durability.replicas`
    replicas hold it; `NotReplicated` (transient) if they do not within its `timeout_ms`.

    WAIT counts the writes of its own connection, so both run on one connection taken from the
    pool. An action that finds its work already done (a retried commit, an update the ingest
    service already added) must still write something (the same value again) for its WAIT to
    cover the earlier write: the offset WAIT waits for is that of the connection's last write.
    Off (0 replicas), `write` runs on `redis` as it is.
    """
    wanted, timeout_ms = durability.replicas, durability.timeout_ms
    if not wanted:
        return await write(redis)
    async with redis.client() as connection:
        result = await write(connection)
        reached = int(await connection.wait(wanted, timeout_ms))
    if reached < wanted:
        raise NotReplicated(f"WAIT: {reached} of {wanted} replicas within {timeout_ms} ms")
    return result


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


def as_text(value: str | bytes) -> str:
    """A reply field as text, whether the client decodes replies or not."""
    return value.decode() if isinstance(value, bytes) else value
