"""The Redis client fedasync connects with, a device's and every service's alike.

Binary responses (payloads are msgpack), RESP2 pinned so replies have one shape, a socket timeout,
no CLIENT SETINFO, and no automatic re-send: redis-py would otherwise silently retry a command
after a connection error, and a commit must only ever be retried on purpose (see
services/aggregator/commit.py). What a failover does to a call in flight is classified here,
once: besides a lost connection, the replies a server gives while it is being demoted, promoted
or cut off from its replicas (`FAILOVER_CODES`) become `FailoverError`, a connection error, so
every caller's `except TRANSIENT` treats them as transient and the next attempt goes to whichever
server is the primary by then. Durable mode is `replicated`: the write and a WAIT on one
connection.

Part of the device client because a device writing straight to Redis (a trusted network) needs
all of it and nothing of the services; the services' connections (services/runtime/redis_conn.py:
Sentinels, the retry policy) are built on it, so both sides recover from the same errors the
same way.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fedasync.shared.durability import Durability

T = TypeVar("T")

#: socket read timeout (seconds) unless configured (FEDASYNC_REDIS__SOCKET_TIMEOUT_S)
SOCKET_TIMEOUT_S = 10.0
#: connect timeout (seconds) unless configured (FEDASYNC_REDIS__CONNECT_TIMEOUT_S)
CONNECT_TIMEOUT_S = 5.0
#: seconds between the PINGs redis-py sends on a connection idle that long, before using it
HEALTH_CHECK_S = 30

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


class FailoverAware(AbstractConnection):
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


class FailoverAwareConnection(FailoverAware, Connection):
    pass


class FailoverAwareSSLConnection(FailoverAware, SSLConnection):
    pass


class FailoverAwareUnixConnection(FailoverAware, UnixDomainSocketConnection):
    pass


FAILOVER_AWARE: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: FailoverAwareConnection,
    SSLConnection: FailoverAwareSSLConnection,
    UnixDomainSocketConnection: FailoverAwareUnixConnection,
}


def client_options(socket_timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    """What every fedasync Redis client is made with (a URL's, the Sentinels', a primary's)."""
    return {
        "protocol": 2,
        "decode_responses": False,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        **_NO_CLIENT_INFO,
    }


def connect_url(
    url: str,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> aioredis.Redis:
    """A client for the server at `url`, its connections failover-aware; nothing is sent until
    first use."""
    options = client_options(socket_timeout_s, connect_timeout_s)
    client = aioredis.Redis.from_url(url, health_check_interval=HEALTH_CHECK_S, **options)
    pool = client.connection_pool
    pool.connection_class = FAILOVER_AWARE.get(pool.connection_class, pool.connection_class)
    return client


async def replicated(
    redis: aioredis.Redis,
    durability: Durability,
    write: Callable[[aioredis.Redis], Awaitable[T]],
    *,
    key: str | None = None,
) -> T:
    """Run `write` and, in durable mode, return only once WAIT says `durability.replicas`
    replicas hold it; `NotReplicated` (transient) if they do not within its `timeout_ms`.

    WAIT counts the writes of its own connection, so both run on one connection taken from the
    pool. An action that finds its work already done (a retried commit, an update the ingest
    service already added) must still write something (the same value again) for its WAIT to
    cover the earlier write: the offset WAIT waits for is that of the connection's last write.
    Off (0 replicas), `write` runs on `redis` as it is.

    On a Redis Cluster (`redis` a cluster client) `key` names the slot the write is about: the
    write and the WAIT run on one connection of that slot's primary (fedasync/client/
    cluster_link.py). A redirect or a lost primary there is a `FailoverError`, after which the
    cluster client learns the slot map again, so the repeat goes to the new primary.
    """
    wanted, timeout_ms = durability.replicas, durability.timeout_ms
    if not wanted:
        return await write(redis)
    if not isinstance(redis, RedisCluster):
        return await _write_and_wait(redis, write, wanted, timeout_ms)
    if key is None:
        raise TypeError("a durable write on a Redis Cluster needs key= (the slot it writes)")
    on_primary: Any = getattr(redis, "on_primary", None)
    if on_primary is None:
        raise TypeError(
            "a durable write on a Redis Cluster needs the client connect_cluster makes "
            f"(a LinkedCluster, fedasync/client/cluster_link.py), not {type(redis).__name__}"
        )
    result: T = await on_primary(
        key, lambda primary: _write_and_wait(primary, write, wanted, timeout_ms)
    )
    return result


async def _write_and_wait(
    redis: aioredis.Redis,
    write: Callable[[aioredis.Redis], Awaitable[T]],
    wanted: int,
    timeout_ms: int,
) -> T:
    """`write`, then WAIT, on one connection of `redis`'s pool."""
    async with redis.client() as connection:
        result = await write(connection)
        reached = int(await connection.wait(wanted, timeout_ms))
    if reached < wanted:
        raise NotReplicated(f"WAIT: {reached} of {wanted} replicas within {timeout_ms} ms")
    return result


def as_text(value: str | bytes) -> str:
    """A reply field as text, whether the client decodes replies or not."""
    return value.decode() if isinstance(value, bytes) else value
