"""Builders for integration tests: updates on the stream, a small initial model, ledger reads,
a redis-server under the generated ACL file and its users' clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.ingest.app import INGEST
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import RedisSettings, Settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.acl import acl_file, all_users
from fedasync.services.stores.ledger import records
from fedasync.shared import stream_entry
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.keys import Keys
from fedasync.shared.layout import Layout
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update

SIZE = 8


def initial_state(settings: Settings, size: int = SIZE) -> AggregationState:
    return AggregationState(
        np.linspace(-1, 1, size, dtype=np.float32),
        Layout.of([("w", (size - 1,)), ("b", (1,))]),
        dedup=DedupMemory(settings.dedup.horizon, settings.dedup.capacity),
    )


def make_update(update_id: str, base: int, value: float = 1.0, *, client: str = "c0") -> Update:
    weights = np.full(SIZE, value, np.float32) + np.arange(SIZE, dtype=np.float32) / 10
    return Update(update_id, client, base, 10, weights, created_at=1.0, metrics={"loss": 0.5})


async def publish(redis: aioredis.Redis, keys: Keys, payload: bytes | Update) -> bytes:
    raw = encode_update(payload) if isinstance(payload, Update) else payload
    entry_id: bytes = await redis.xadd(keys.updates, stream_entry.build(raw))
    return entry_id


async def ledger(redis: aioredis.Redis, keys: Keys) -> list[dict[str, Any]]:
    return [r async for r in records(redis, keys)]


#: fields of a ledger record that say where and when, not what was decided
CONTEXT = ("stream_id", "at", "ledger_id")


def decided(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger records without their CONTEXT: what was decided, as `Decision.to_dict()` says it."""
    return [{k: v for k, v in r.items() if k not in CONTEXT} for r in records]


async def dead_letters(redis: aioredis.Redis, keys: Keys) -> list[dict[bytes, bytes]]:
    entries: Any = await redis.xrange(keys.deadletter)
    return [fields for _, fields in entries]


#: how long `wait_for_ledger` waits for the decisions it was asked for, in all
LEDGER_DEADLINE_S = 60.0
#: one blocking XREAD: shorter than the clients' socket timeout (5 s), which it would trip
_BLOCK_MS = 2_000


async def next_entries(
    redis: aioredis.Redis, stream: str, after: str, within_s: float, count: int | None = None
) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of `stream` after `after` (at most `count`), blocking (no polling) until one
    is there, for at most `within_s`: TimeoutError after that.

    The wait is cut into XREADs of 2 s: redis-py applies the client's socket timeout to a
    blocking read, so one XREAD blocking longer would fail at that timeout, not at `within_s`.
    """
    deadline = time.monotonic() + within_s
    while True:
        reply: Any = await redis.xread({stream: after}, block=_BLOCK_MS, count=count)
        if reply:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = reply[0][1]
            return entries
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing added to {stream} after {after} within {within_s:g} s")


async def wait_for_ledger(redis: aioredis.Redis, keys: Keys, after: str, count: int) -> str:
    """Block on the ledger stream (no polling) until `count` more decisions are committed, for
    at most LEDGER_DEADLINE_S (a loaded machine may take long to start an aggregator)."""
    seen = 0
    deadline = time.monotonic() + LEDGER_DEADLINE_S
    while seen < count:
        left = max(deadline - time.monotonic(), 0.0)
        entries = await next_entries(redis, keys.ledger, after, left, count - seen)
        seen += len(entries)
        after = entries[-1][0].decode()
    return after


async def start_snapshot(
    settings: Settings, redis: aioredis.Redis, stopping: asyncio.Event
) -> tuple[asyncio.Task[None], str]:
    """The snapshot service in this process on a free port, until `stopping`; its task and URL
    once it listens."""
    on_free_port = settings.model_copy(
        update={"snapshot": settings.snapshot.model_copy(update={"port": 0})}
    )
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_snapshot(
            on_free_port, redis=redis, handle_signals=False, stopping=stopping, started=started
        )
    )
    return task, f"http://127.0.0.1:{await started}"


def ingest_refusals(client: TestClient[Any, Any], reason: str) -> float:
    """How many requests an ingest app under test refused with `reason` (its metric)."""
    registry = client.app[INGEST].metrics.registry
    value = registry.get_sample_value("fedasync_ingest_refusals_total", {"reason": reason})
    return float(value or 0.0)


# ------------------------------------------------------------------------------------ ACL'd Redis
#: the key prefix of the ACL'd servers: the default, as in docker/redis/users.acl
ACL_PREFIX = "fedasync"
#: the users of the generated ACL file (services/stores/acl.py)
ACL_USERS = tuple(user.name for user in all_users(ACL_PREFIX))
#: a test-only user with every right, in every ACL'd server: it only watches (it blocks on
#: streams instead of polling, and reads what an ACL cannot hide from it); no service uses it
OBSERVER = "observer"


def password_of(user: str) -> str:
    """A user's password on an ACL'd server, generated or test-only alike."""
    return f"{user}-test-password-0"


def acl_user_line(user: str, rules: str) -> str:
    """The ACL file line of a test-only user with `rules` (its password `password_of`)."""
    return f"user {user} on >{password_of(user)} {rules}\n"


@contextmanager
def acl_redis(folder: Path, *extra: str) -> Iterator[RedisServer]:
    """A redis-server of its own in `folder`, started with the generated ACL file for
    ACL_PREFIX (as compose starts one), the observer and the `extra` lines (`acl_user_line`)."""
    path = folder / "users.acl"
    passwords = {user: password_of(user) for user in ACL_USERS}
    observer = acl_user_line(OBSERVER, "~* &* +@all")
    path.write_text(acl_file(ACL_PREFIX, passwords) + observer + "".join(extra))
    server = RedisServer(folder / "redis", extra_args=("--aclfile", str(path)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def acl_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{password_of(user)}@127.0.0.1:{server.port}/0"


def acl_client(server: RedisServer, user: str) -> aioredis.Redis:
    return connect(RedisSettings(url=acl_url(server, user), socket_timeout_s=5.0))
