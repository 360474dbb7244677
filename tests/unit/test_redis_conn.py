"""The Redis client's failover classification and its Sentinel wiring, without a server.

What a server caught in a failover answers (services/runtime/redis_conn.py, `FAILOVER_CODES`)
must be transient for every caller's retry policy; a server against real Sentinels is in
tests/integration/test_sentinel.py.
"""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    NoPermissionError,
    ReadOnlyError,
    ResponseError,
)

from fedasync.services.runtime.redis_conn import (
    TRANSIENT,
    FailoverAwareConnection,
    FailoverAwareSentinelConnection,
    FailoverAwareSSLConnection,
    FailoverAwareUnixConnection,
    FailoverError,
    NotReplicated,
    SentinelRedis,
    connect,
    failover_reply,
)
from fedasync.services.runtime.settings import RedisSettings


@pytest.mark.parametrize(
    "error",
    [
        ReadOnlyError("You can't write against a read only replica.", status_code="READONLY"),
        MasterDownError("Link with MASTER is down", status_code="MASTERDOWN"),
        BusyLoadingError("Redis is loading the dataset in memory", status_code="LOADING"),
        ResponseError("NOREPLICAS Not enough good replicas to write."),
        # the same refusal raised inside the commit script keeps its code
        ResponseError(
            "NOREPLICAS Not enough good replicas to write. script: 1c2d, on @user_script"
        ),
        ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"),
    ],
)
def test_a_failover_reply_is_recognised(error: ResponseError) -> None:
    assert failover_reply(error)


@pytest.mark.parametrize(
    "error",
    [
        ResponseError("ERR unknown command 'FOO'"),
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        NoPermissionError("this user has no permissions", status_code="NOPERM"),
        ResponseError("BUSYGROUP Consumer Group name already exists"),
    ],
)
def test_other_refusals_are_not_a_failover(error: ResponseError) -> None:
    assert not failover_reply(error)


def test_failover_errors_are_transient() -> None:
    assert issubclass(FailoverError, TRANSIENT)
    assert issubclass(NotReplicated, FailoverError)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://u:p@127.0.0.1:6390/0", FailoverAwareConnection),
        ("rediss://u:p@127.0.0.1:6390/0", FailoverAwareSSLConnection),
        ("unix:///tmp/redis.sock", FailoverAwareUnixConnection),
    ],
)
async def test_a_plain_client_classifies_failover_replies_whatever_its_scheme(
    url: str, kind: type
) -> None:
    client = connect(RedisSettings(url=url))
    try:
        assert client.connection_pool.connection_class is kind
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_with_sentinels_the_url_gives_only_user_password_and_database() -> None:
    settings = RedisSettings(
        url="redis://aggregator:s%40cret@ignored.example:1/3",
        sentinels="127.0.0.1:1,127.0.0.1:2",
        master_name="fleet",
        sentinel_username="discovery",
        sentinel_password="discovery-password",  # type: ignore[arg-type]
    )
    client = connect(settings)
    try:
        assert isinstance(client, SentinelRedis)
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.connection_class is FailoverAwareSentinelConnection
        assert pool.service_name == "fleet"
        kwargs = pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["db"]) == (
            "aggregator",
            "s@cret",
            3,
        )
        sentinels = pool.sentinel_manager.sentinels
        assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
        for sentinel in sentinels:
            found = sentinel.connection_pool.connection_kwargs
            assert (found["username"], found["password"]) == ("discovery", "discovery-password")
    finally:
        await client.aclose()  # closes the Sentinels' clients too
