"""Redis Cluster as a configuration: the client, and aiming keyless commands at a run's node.

With `FEDASYNC_REDIS__CLUSTER` set every service talks to a Redis Cluster through redis-py's
cluster client. Each run's keys share one hash tag, so a run lives on one slot and every script
and transaction of a run runs on one node. Commands without keys (PING, INFO, WAIT, SCRIPT LOAD)
would go to a default node or to every primary; run code aims them at the node of one of its
keys with `node_of` (docs/architecture.md, "Many runs, and Redis Cluster").
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from fedasync.client.cluster_link import ClusterConnection, LinkedCluster
from fedasync.client.redis_link import HEALTH_CHECK_S, client_options
from fedasync.services.runtime.settings import RedisSettings


def is_cluster(redis: Any) -> bool:
    """Whether `redis` is a cluster client (its keyless commands need a target node)."""
    return isinstance(redis, aioredis.RedisCluster)


def connect_cluster(settings: RedisSettings) -> aioredis.Redis:
    """A cluster client for the configured seed nodes, with no client-side retry (a re-sent
    commit would be a second decision: `retrying` is the one retry policy) and without full
    coverage (a lost primary must not stop the runs on the others).

    The URL, if any, gives only the user and password (its host is not used). Connections are
    failover-aware (`ClusterConnection`: CLUSTERDOWN is a failover, as READONLY is), and the
    client is a `LinkedCluster`, whose per-primary clients carry durable writes
    (`replicated(..., key=)`).

    Typed as the plain client it stands in for: every store and service is written against
    `aioredis.Redis`, and the cluster client answers the same commands (keyed ones by slot)."""
    if not settings.cluster_list:
        raise ValueError("no cluster nodes: set FEDASYNC_REDIS__CLUSTER (host:port,host:port)")
    target = urlsplit(settings.url) if settings.url else None
    options = client_options(settings.socket_timeout_s, settings.connect_timeout_s)
    client = LinkedCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in settings.cluster_list],
        require_full_coverage=False,
        username=unquote(target.username) if target and target.username else None,
        password=unquote(target.password) if target and target.password else None,
        health_check_interval=HEALTH_CHECK_S,
        **options,
    )
    # redis-py builds every node (the seeds, and those it learns of) from these keyword
    # arguments, and takes no connection class for them: set it on both
    client.connection_kwargs["connection_class"] = ClusterConnection
    for node in client.startup_nodes:
        node.connection_class = ClusterConnection
    return client  # type: ignore[return-value]


def node_of(redis: aioredis.Redis, key: str) -> Any:
    """The primary node that holds `key`'s slot, for keyless commands about that key's run.

    From the slot map the client holds: after `await redis.initialize()` (any command does
    it); `on_node_of` is the one that learns it first."""
    if not isinstance(redis, aioredis.RedisCluster):
        raise TypeError(f"node_of needs a cluster client, not {type(redis).__name__}")
    return redis.get_node_from_key(key)


async def on_node_of(redis: aioredis.Redis, key: str, *command: Any) -> Any:
    """Run a keyless command (PING, INFO, SCRIPT LOAD, ...) on the primary of `key`'s slot on a
    cluster, on the one server otherwise; its reply as a plain client gives it."""
    if not isinstance(redis, aioredis.RedisCluster):
        return await redis.execute_command(*command)  # type: ignore[no-untyped-call]
    await redis.initialize()
    node = node_of(redis, key)
    reply = await redis.execute_command(*command, target_nodes=node)
    # redis-py folds the replies of a command sent to several nodes into {node name: reply}
    # for some commands (SCRIPT LOAD, PING); one target node gives a one-entry dict
    if isinstance(reply, dict) and list(reply) == [node.name]:
        return reply[node.name]
    return reply
