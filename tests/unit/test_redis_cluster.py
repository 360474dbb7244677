"""The Redis Cluster client as configured, without a cluster: what it is made with, what a run's
keys hash to, how a node link classes a redirect, and the refusals before anything is sent."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, ResponseError, TryAgainError

from fedasync.client.cluster_link import (
    ClusterConnection,
    LinkedCluster,
    NodeLinkConnection,
)
from fedasync.client.redis_link import FailoverError, replicated
from fedasync.services.runtime.redis_cluster import connect_cluster, is_cluster, node_of
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import load_settings
from fedasync.shared.durability import Durability
from fedasync.shared.keys import Keys

NODES = "127.0.0.1:7000,127.0.0.1:7001"


def cluster_settings(**redis: Any) -> Any:
    return load_settings(redis={"cluster": NODES, **redis}).redis


def test_connect_makes_a_cluster_client_that_never_resends_by_itself() -> None:
    settings = cluster_settings(
        url="redis://svc:s%40cret@ignored:1/0", socket_timeout_s=3.0, connect_timeout_s=2.0
    )
    client: Any = connect(settings)
    assert is_cluster(client)
    assert isinstance(client, LinkedCluster)
    assert client.retry.get_retries() == 0
    assert client.nodes_manager.require_full_coverage is False
    options = client.connection_kwargs
    assert (options["username"], options["password"]) == ("svc", "s@cret")
    assert options["protocol"] == 2
    assert options["decode_responses"] is False
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (3.0, 2.0)
    assert options["connection_class"] is ClusterConnection
    assert [(n.host, n.port) for n in client.startup_nodes] == [
        ("127.0.0.1", 7000),
        ("127.0.0.1", 7001),
    ]
    assert {n.connection_class for n in client.startup_nodes} == {ClusterConnection}


def test_without_a_cluster_connect_keeps_the_plain_client() -> None:
    client = connect(load_settings(redis={"url": "redis://127.0.0.1:1/0"}).redis)
    assert not is_cluster(client)
    with pytest.raises(TypeError, match="cluster client"):
        node_of(client, "{a}:state")


def test_a_url_given_to_connect_wins_over_the_cluster() -> None:
    """A command aimed at one server (a run folder's copy, a node) still gets a plain client."""
    assert not is_cluster(connect(cluster_settings(), "redis://127.0.0.1:1/0"))


def test_connect_cluster_needs_nodes() -> None:
    with pytest.raises(ValueError, match="FEDASYNC_REDIS__CLUSTER"):
        connect_cluster(load_settings(redis={"url": "redis://127.0.0.1:1/0"}).redis)


def test_durable_mode_is_on_by_default_with_a_cluster() -> None:
    assert cluster_settings().durability.replicas == 1


def test_every_key_of_a_run_is_in_one_slot() -> None:
    """commit.lua builds `{p}:model:N` itself (undeclared): it shares the declared keys' slot
    because every name of a run carries the run's hash tag."""
    keys = Keys("run-a")
    names = [
        getattr(keys, name)
        for name, member in inspect.getmembers(Keys)
        if isinstance(member, property)
    ]
    names += [keys.model(7), keys.model(123456), keys.ingested("ab" * 20)]
    assert len(names) > 20
    assert {key_slot(name.encode()) for name in names} == {key_slot(b"run-a")}


def test_every_parse_callback_of_a_linked_cluster_takes_the_keys_option() -> None:
    """redis-py 8.1's cluster transactions pass `keys=` to the callbacks after EXEC."""
    client: Any = connect(cluster_settings())
    hgetall = client.response_callbacks["HGETALL"]
    assert hgetall([b"a", b"1"], keys=["{r}:memory"]) == {b"a": b"1"}


@pytest.mark.asyncio
async def test_a_durable_write_on_a_cluster_needs_the_slot_it_writes() -> None:
    client: Any = connect(cluster_settings())

    async def write(_: Any) -> int:
        raise AssertionError("nothing may be sent without a key")

    with pytest.raises(TypeError, match="key="):
        await replicated(client, Durability(replicas=1), write)


@pytest.mark.asyncio
async def test_a_durable_write_needs_the_linked_cluster_client() -> None:
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    plain: Any = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 7000)])

    async def write(_: Any) -> int:
        raise AssertionError("nothing may be sent on a client without links")

    with pytest.raises(TypeError, match="LinkedCluster"):
        await replicated(plain, Durability(replicas=1), write, key="{a}:state")


@pytest.mark.parametrize(
    ("error", "link", "cluster"),
    [
        (MovedError("1341 127.0.0.1:7001"), True, False),
        (AskError("1341 127.0.0.1:7001"), True, False),
        (TryAgainError("Multiple keys request during rehashing of slot"), True, False),
        (ClusterDownError("Hash slot not served"), True, True),
        (ResponseError("READONLY You can't write against a read only replica."), True, True),
        (ResponseError("ERR unknown command"), False, False),
    ],
)
@pytest.mark.asyncio
async def test_which_replies_are_a_failover_on_a_link_and_on_the_cluster_client(
    monkeypatch: pytest.MonkeyPatch, error: Exception, link: bool, cluster: bool
) -> None:
    """A per-primary link follows no redirect, so MOVED, ASK and TRYAGAIN are a failover there
    (repeat it where the new slot map says); the cluster client follows those itself, and only
    CLUSTERDOWN (and the failover replies of any server) become one on its connections."""

    async def answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(Connection, "read_response", answer)
    for connection_class, expected in ((NodeLinkConnection, link), (ClusterConnection, cluster)):
        connection = connection_class(host="127.0.0.1", port=7000)
        with pytest.raises((ResponseError, FailoverError)) as raised:
            await connection.read_response()
        assert isinstance(raised.value, FailoverError) is expected, connection_class
        if not expected:
            assert raised.value is error
