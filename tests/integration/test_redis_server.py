"""The private redis-server `fedasync up` and the tests start is the one that answers.

Between `free_port` and the server's bind another process may take the port; its server then
answers PING while ours exits with "Address already in use". Starting must notice (our server's
own "Ready" line), and on a port it picked itself start again on another.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fedasync.services.commands.redis_launch import server as redis_server
from fedasync.services.commands.redis_launch.server import PortTaken, RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def other(tmp_path: Path) -> Iterator[RedisServer]:
    """Someone else's Redis, already listening."""
    server = RedisServer(tmp_path / "other")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def answering_pid(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_a_port_picked_here_and_taken_meanwhile_is_replaced(
    tmp_path: Path, other: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks = iter([other.port])  # the first pick is the port the other server took
    real = redis_server.free_port
    monkeypatch.setattr(redis_server, "free_port", lambda: next(picks, None) or real())
    ours = RedisServer(tmp_path / "ours")
    assert ours.port == other.port
    ours.start()
    try:
        assert ours.port != other.port
        assert ours.process is not None
        assert answering_pid(ours) == ours.process.pid  # ours answers, not the other
    finally:
        ours.stop()
    assert "Address already in use" in (tmp_path / "ours" / "redis.log").read_text()


def test_a_port_given_and_taken_is_an_error_not_the_other_server(
    tmp_path: Path, other: RedisServer
) -> None:
    ours = RedisServer(tmp_path / "ours", port=other.port)
    with pytest.raises(PortTaken, match=str(other.port)):
        ours.start()
    assert other.process is not None
    assert answering_pid(other) == other.process.pid
