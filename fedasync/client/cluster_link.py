"""Durable writes on a Redis Cluster: one plain client per primary, for a write and its WAIT.

WAIT counts the writes of the connection it is sent on, so durable mode (`redis_link.replicated`)
runs the write and the WAIT on one connection. redis-py's cluster client has no such thing to
lend (no `.client()`; each command takes any free connection of its node, and a keyless WAIT
goes to the *default* node, not to the primary that took the write). `LinkedCluster` is the
cluster client plus `links`: a plain client per primary, made on first use with the cluster
client's own credentials and timeouts, whose connection a durable write borrows.

Those plain clients know nothing of slots: if the slot moved since the cluster client last
learned the map, the node answers MOVED (or, while it is cut off or its slot is being failed
over, CLUSTERDOWN, TRYAGAIN, ASK). `NodeLinkConnection` turns those into `FailoverError` like
every other failover reply (nothing was run: the command may be repeated), and
`LinkedCluster.on_primary` then has the cluster client re-learn the slot map, so the repeat
goes to the new primary. The cluster client's own connections (`ClusterConnection`) follow
MOVED and ASK as redis-py does, and read only CLUSTERDOWN as a failover.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from fedasync.client.redis_link import TRANSIENT, FailoverAware, FailoverError, NotReplicated

T = TypeVar("T")

#: what a cluster node answers, besides the failover replies of any primary, when it is not
#: (or not now) the one to run a command on a slot (MOVED, ASK, CLUSTERDOWN, TRYAGAIN): nothing
#: was run, so it may be repeated. As the classes redis-py's parser makes of them (it drops
#: the code from the text)
_CLUSTER_ERRORS = (MovedError, AskError, ClusterDownError, TryAgainError)

#: connection settings the per-primary clients copy from the cluster client's
_COPIED = (
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
    "protocol",
    "decode_responses",
    "encoding",
    "encoding_errors",
    "driver_info",
)


class ClusterConnection(FailoverAware, Connection):
    """A cluster client's connection: CLUSTERDOWN (the slot's primary failed and no replica is
    promoted yet) is a failover too, so callers retry it as they retry a lost connection, and
    the cluster client, seeing a connection error, learns the slot map again. MOVED and ASK
    stay as they are: the cluster client follows them itself."""

    #: the replies (as redis-py's parser classes them, dropping the code) read as a failover
    refused: tuple[type[Exception], ...] = (ClusterDownError,)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except FailoverError:
            raise
        except self.refused as exc:
            await self.disconnect()
            raise FailoverError(
                f"{type(exc).__name__} {exc} (the slot's primary changed: repeat it)"
            ) from exc


class NodeLinkConnection(ClusterConnection):
    """A per-primary connection, which follows no redirect: MOVED, ASK and TRYAGAIN are a
    failover as well (nothing was run; the repeat goes where the new slot map says)."""

    refused = _CLUSTER_ERRORS


class NodeLinks:
    """A plain client per primary (by address), made on first use, with `options`."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = {name: options[name] for name in _COPIED if name in options}
        self._clients: dict[str, aioredis.Redis] = {}

    def to(self, node: ClusterNode) -> aioredis.Redis:
        """The client of `node` (its connections are this module's failover-aware ones)."""
        client = self._clients.get(node.name)
        if client is None:
            pool = aioredis.ConnectionPool(
                connection_class=NodeLinkConnection,
                host=node.host,
                port=int(node.port),
                **self._options,
            )
            client = self._clients[node.name] = aioredis.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


def _without_keys(callback: Callable[..., Any]) -> Callable[..., Any]:
    def parse(response: Any, keys: Any = None, **options: Any) -> Any:
        return callback(response, **options)

    return parse


#: the stream reads whose keys redis-py would ask a node for (COMMAND GETKEYS: "movablekeys"),
#: and the first argument from which their options (COUNT, BLOCK, NOACK, STREAMS) may come
_STREAM_READS = {"XREAD": 1, "XREADGROUP": 4}


def _text(arg: Any) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def stream_read_keys(*args: Any) -> tuple[Any, ...] | None:
    """The keys of an XREAD or XREADGROUP (the first half of what follows STREAMS); None for
    any other command. Pure: no node is asked."""
    start = _STREAM_READS.get(_text(args[0]).upper()) if args else None
    if start is None:
        return None
    for i in range(start, len(args)):
        if _text(args[i]).upper() == "STREAMS":
            rest = args[i + 1 :]
            return tuple(rest[: len(rest) // 2])
    return None


class StreamKeysParser(AsyncCommandsParser):
    """redis-py's command parser, which finds the keys of a stream read itself.

    redis-py routes a command whose keys it cannot place by the COMMAND table (XREAD and
    XREADGROUP among them) by asking one node, the parser's (the default node of the first
    slot-map reading), with COMMAND GETKEYS before each call. While that node is down, every
    run's group read fails whatever its own slot's primary (seen in the cluster failover
    audit: the bystanders' aggregators stopped deciding until the killed node came back). Their
    keys are where the syntax puts them."""

    async def get_keys(self, *args: Any) -> tuple[Any, ...] | None:
        keys = stream_read_keys(*args)
        if keys:
            return keys
        found: tuple[Any, ...] | None = await super().get_keys(*args)
        return found


class LinkedCluster(RedisCluster):
    """redis-py's cluster client, with a plain client per primary for durable writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.links = NodeLinks(self.connection_kwargs)
        # a group read's keys found without a round trip to one node (StreamKeysParser)
        self.commands_parser = StreamKeysParser()
        # redis-py 8.1's cluster transactions (MULTI/EXEC after WATCH) hand each reply's
        # callback the command's `keys=` option, which the plain client drops first (it is
        # for client-side caching only), and the callbacks of HGETALL, XREVRANGE and others
        # take no such argument: a TypeError after EXEC. Every callback drops it here (the
        # node connections share this dict)
        callbacks = self.response_callbacks
        for name, callback in list(callbacks.items()):
            callbacks[name] = _without_keys(callback)

    async def primary_for(self, key: str) -> ClusterNode:
        """The primary of `key`'s slot, learning the slot map first if it is stale."""
        await self.initialize()
        node = self.get_node_from_key(key)
        if node is None:
            raise FailoverError(f"no primary serves the slot of {key} (yet): repeat it")
        return node

    async def on_primary(self, key: str, action: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """`action` on the plain client of `key`'s primary (`redis_link.replicated`: a write and
        its WAIT on one of its connections). After a lost primary or a redirect there, the slot
        map is learnt again before the next command, so the repeat goes to the new primary; a
        WAIT short of replicas (NotReplicated) changes no slot."""
        client = self.links.to(await self.primary_for(key))
        try:
            return await action(client)
        except NotReplicated:
            raise
        except TRANSIENT:
            relearn(self)
            raise

    async def aclose(self) -> None:
        """Close every connection, the nodes' and the links'. redis-py closes the nodes only
        while its slot map is fresh: after a connection error (which marks it stale until the
        next command) its `aclose` closes nothing, and the open connections leak."""
        await super().aclose()
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")
        await self.links.aclose()


def relearn(cluster: RedisCluster) -> None:
    """Have `cluster` learn the slot map again before its next command (after a redirect or a
    lost primary seen on a link): what redis-py does itself after a connection error, without
    closing the connections other commands are using."""
    cluster._initialize = True
