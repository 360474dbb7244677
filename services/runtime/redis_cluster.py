"""Redis Cluster as a configuration: the client, and aiming keyless commands at a run's node.

With `FEDASYNC_REDIS__CLUSTER` set every service talks to a Redis Cluster through redis-py's
cluster client. Each run's keys share one hash tag, so a run lives on one slot and every script
and transaction of a run runs on one node. Commands without keys (PING, INFO, WAIT, SCRIPT LOAD)
would go to a default node or to every primary; run code aims them at the node of one of its
keys with `node_of`. (Built by the cluster-plumbing step of issue 28; see docs/plans/issue-28.md.)
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.settings import RedisSettings


def is_cluster(redis: Any) -> bool:
    """Whether `redis` is a cluster client (its keyless commands need a target node)."""
    return isinstance(redis, aioredis.RedisCluster)


def connect_cluster(settings: RedisSettings) -> aioredis.Redis:
    """A cluster client for the configured seed nodes, with no client-side retry (a re-sent
    commit would be a second decision: `retrying` is the one retry policy) and without full
    coverage (a lost primary must not stop the runs on the others).

    Typed as the plain client it stands in for: every store and service is written against
    `aioredis.Redis`, and the cluster client answers the same commands (keyed ones by slot)."""
    raise NotImplementedError("Redis Cluster support is being built (issue 28)")


def node_of(redis: aioredis.Redis, key: str) -> Any:
    """The primary node that holds `key`'s slot, for keyless commands about that key's run."""
    raise NotImplementedError("Redis Cluster support is being built (issue 28)")
