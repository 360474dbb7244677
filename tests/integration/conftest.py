"""Integration fixtures: a private, real redis-server per test module, clients, settings."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.commands.redis_launch.cluster import ClusterAuth, LocalCluster
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.acl import all_users
from tests.integration.helpers import OBSERVER, acl_redis, password_of


@pytest.fixture
def redis_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A redis-server of this test's own, named by FEDASYNC_REDIS__URL (every other FEDASYNC_
    variable cleared): for commands that read their settings from the environment."""
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    server = RedisServer(tmp_path / "redis")
    server.start()
    monkeypatch.setenv("FEDASYNC_REDIS__URL", server.url)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def acl_extra_users() -> tuple[str, ...]:
    """Test-only ACL lines `acl_server` adds (helpers.acl_user_line); a module overrides this
    fixture to add its own users."""
    return ()


@pytest.fixture
def acl_server(tmp_path: Path, acl_extra_users: tuple[str, ...]) -> Iterator[RedisServer]:
    """A fresh redis-server per test under the generated ACL file, the observer, and the
    module's `acl_extra_users` (services connect as their own users: helpers.acl_client)."""
    with acl_redis(tmp_path, *acl_extra_users) as server:
        yield server


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of our own (AOF, appendfsync always), never the shared one on 6379."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def settings(redis_server: RedisServer, request: pytest.FixtureRequest) -> Settings:
    """Settings pointing at the private server, with a key prefix unique to the test."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    prefix = f"t-{request.node.originalname[:40]}-{digest}"
    return load_settings(
        redis={"url": redis_server.url, "key_prefix": prefix, "socket_timeout_s": 5.0},
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": 0},
    )


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Redis Cluster of our own for the module: three primaries, a replica each (six
    processes, so once per module), never the shared Redis."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


#: every user of the ACL file for all runs on a cluster (`fedasync acl --all-runs --cluster`)
CLUSTER_ACL_USERS = tuple(u.name for u in all_users("fedasync", all_runs=True, cluster=True))


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """`redis_cluster` under the ACL file for every run on a cluster, each user's password
    `helpers.password_of(user)`: replicas log in as `replica`, the cluster is made as
    `cluster-admin`, the harness asks as the test-only observer (every right)."""
    passwords = {user: password_of(user) for user in CLUSTER_ACL_USERS}
    auth = ClusterAuth.generated(passwords, (OBSERVER, password_of(OBSERVER)))
    cluster = LocalCluster(tmp_path_factory.mktemp("acl-cluster"), auth=auth)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_settings(redis_cluster: LocalCluster, request: pytest.FixtureRequest) -> Settings:
    """`settings`, on the cluster: a key prefix (a run) unique to the test, durable mode as by
    default with a cluster (one replica)."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    prefix = f"t-{request.node.originalname[:40]}-{digest}"
    return load_settings(
        redis=redis_cluster.redis_settings(key_prefix=prefix, socket_timeout_s=5.0),
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": 0},
    )


@pytest_asyncio.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = connect(settings.redis)
    try:
        yield client
    finally:
        await client.aclose()
