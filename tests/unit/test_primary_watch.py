"""Reading the Sentinels' failover announcement and a server's HELLO (primary_watch.py)."""

from __future__ import annotations

import asyncio

import pytest

from fedasync.services.commands.redis_launch.server import free_port
from fedasync.services.runtime.primary_watch import hello_role, switch_of
from fedasync.services.runtime.redis_conn import WatchedSentinelPool, connect
from fedasync.services.runtime.settings import RedisSettings


def test_a_switch_of_our_primary_names_the_new_one() -> None:
    assert switch_of(b"fedasync 10.0.0.1 6379 10.0.0.2 6380", "fedasync") == ("10.0.0.2", 6380)
    assert switch_of("fedasync redis 6379 redis-replica-1 6379", "fedasync") == (
        "redis-replica-1",
        6379,
    )


def test_a_switch_of_another_primary_or_a_garbled_one_is_ignored() -> None:
    assert switch_of(b"other 10.0.0.1 6379 10.0.0.2 6380", "fedasync") is None
    assert switch_of(b"fedasync 10.0.0.1 6379", "fedasync") is None
    assert switch_of(b"fedasync 10.0.0.1 6379 10.0.0.2 port", "fedasync") is None


def test_the_role_of_a_hello_reply() -> None:
    reply = [b"server", b"redis", b"proto", 2, b"role", b"replica", b"modules", []]
    assert hello_role(reply) == "replica"
    assert hello_role([b"role", b"master"]) == "master"
    assert hello_role(b"OK") is None


@pytest.mark.asyncio
async def test_a_closed_client_starts_no_listener_again() -> None:
    """A late command on a closed client (during a shutdown) must not subscribe anew: nothing
    would close those listeners, and their sockets would outlive the client."""
    nobody = f"127.0.0.1:{free_port()}"  # no Sentinel there: each listener retries, quietly
    client = connect(RedisSettings(sentinels=f"{nobody},{nobody}"))
    pool = client.connection_pool
    assert isinstance(pool, WatchedSentinelPool)
    pool.watch.ensure_started()
    assert pool.watch.listening == 2  # one per Sentinel
    pool.watch.ensure_started()
    assert pool.watch.listening == 2  # started once, not twice
    await client.aclose()
    assert pool.watch.listening == 0
    pool.watch.ensure_started()
    assert pool.watch.listening == 0


@pytest.mark.asyncio
async def test_closing_ends_a_listener_that_lost_its_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel landing as get_message's own read timeout fires can be taken for that timeout
    (asyncio.timeout on Python 3.11): the listener carries on, and a close that only awaited it
    hung (a CI run: 300 s in aclose). Closing must end it all the same."""
    client = connect(RedisSettings(sentinels=f"127.0.0.1:{free_port()}"))
    pool = client.connection_pool
    assert isinstance(pool, WatchedSentinelPool)
    started, lost = asyncio.Event(), asyncio.Event()

    async def listener_that_loses_a_cancel(sentinel: object) -> None:
        started.set()
        while True:  # as the real loop, to the next read (it also ends on `closed`: not here)
            try:
                await asyncio.sleep(0.01)  # a read with its own timeout, as get_message's
            except asyncio.CancelledError:
                if lost.is_set():
                    raise  # the next cancel is not lost
                lost.set()  # the first is taken for the read's timeout: the loop goes on

    monkeypatch.setattr(pool.watch, "_listen", listener_that_loses_a_cancel)
    pool.watch.ensure_started()
    assert pool.watch.listening == 1
    await started.wait()
    await client.aclose()
    assert lost.is_set()  # the fault happened: the first cancel was lost
    assert pool.watch.listening == 0
