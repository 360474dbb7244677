"""Durable mode against a real primary and replica: WAIT before anything is acknowledged.

`FEDASYNC_REDIS__DURABLE_REPLICAS` = N: a write counts (an update acknowledged to its device, a
commit announced) only once WAIT says N replicas hold it (services/runtime/redis_conn.py,
`replicated`). Short of them the writer gets `NotReplicated`, a transient error its retry policy
repeats; a primary started with `min-replicas-to-write` refuses the write itself, and that refusal
is transient too (`FailoverError`). Each test starts its own primary and replica, so it can take
the replica away.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Batch, Committer, LedgerEntry
from fedasync.services.commands.redis_launch.sentinel import (
    SHIPPED_MIN_REPLICAS_MAX_LAG_S,
    SHIPPED_MIN_REPLICAS_TO_WRITE,
)
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.ingest.store import IngestStore
from fedasync.services.runtime.redis_conn import (
    TRANSIENT,
    FailoverError,
    NotReplicated,
    connect,
    replicated,
    retrying,
)
from fedasync.services.runtime.settings import Durability, RedisSettings
from fedasync.services.stores.device_keys import HMAC, add_device, fingerprint
from fedasync.services.stores.dp_secret import SECRET_BYTES, ensure_secret
from fedasync.shared.device_auth import Proof
from fedasync.shared.keys import Keys, update_digest
from fedasync.shared.wire import pack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

KEYS = Keys("durable")
#: one replica must hold each write; WAIT gives up after this long
DURABLE = Durability(replicas=1, timeout_ms=300)


@dataclass
class Pair:
    primary: RedisServer
    replica: RedisServer

    def start_replica(self) -> None:
        self.replica.extra_args = ("--replicaof", "127.0.0.1", str(self.primary.port))
        self.replica.start()


def pair_of(tmp_path: Path) -> Iterator[Pair]:
    # a replica that (re)starts gets the data at once, not after the default 5 s sync delay
    primary = RedisServer(tmp_path / "primary", extra_args=("--repl-diskless-sync-delay", "0"))
    primary.start()
    pair = Pair(primary, RedisServer(tmp_path / "replica"))
    try:
        pair.start_replica()
        yield pair
    finally:
        drop(pair)


def drop(pair: Pair) -> None:
    """The pair's end, its data thrown away. The replica is killed, not stopped: a replica
    that has just synced is writing its first AOF, and Redis refuses a SIGTERM meanwhile
    ("Writing initial AOF, can't exit"), so a stop would sit out its whole grace (10 s)."""
    pair.replica.kill()
    pair.primary.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    yield from pair_of(tmp_path)


@pytest_asyncio.fixture
async def primary(pair: Pair) -> AsyncIterator[aioredis.Redis]:
    # above wait_linked's WAIT
    client = connect(RedisSettings(url=pair.primary.url, socket_timeout_s=60.0))
    try:
        yield client
    finally:
        await client.aclose()


async def on_replica(pair: Pair, *command: str) -> object:
    client = connect(RedisSettings(url=pair.replica.url, socket_timeout_s=5.0))
    try:
        return await client.execute_command(*command)
    finally:
        await client.aclose()


async def wait_linked(pair: Pair, primary: aioredis.Redis) -> None:
    """WAIT on a write of our own: the replica is linked and in sync (WAIT blocks until then)."""
    await replicated(primary, Durability(1, 45_000), lambda c: c.set("{durable}:probe", 1))


async def test_a_durable_write_returns_once_a_replica_holds_it(
    pair: Pair, primary: aioredis.Redis
) -> None:
    await wait_linked(pair, primary)
    entry = await replicated(primary, DURABLE, lambda c: c.xadd(KEYS.updates, {"m": b"x"}))
    # WAIT counted the replica's acknowledgement of this offset: it has the entry now
    held = await on_replica(pair, "XRANGE", KEYS.updates, entry, entry)
    assert isinstance(held, list)
    assert [row[0] for row in held] == [entry]


async def test_without_its_replica_a_write_is_not_acknowledged_and_that_is_transient(
    pair: Pair, primary: aioredis.Redis
) -> None:
    await wait_linked(pair, primary)
    pair.replica.kill()
    with pytest.raises(NotReplicated, match="0 of 1 replicas") as refused:
        await replicated(primary, DURABLE, lambda c: c.xadd(KEYS.updates, {"m": b"x"}))
    assert isinstance(refused.value, TRANSIENT)
    # the write is on the primary: a retry adds it again, which dedup tells apart downstream
    assert await primary.xlen(KEYS.updates) == 1
    # off, the same write returns at once
    await replicated(primary, Durability(), lambda c: c.xadd(KEYS.updates, {"m": b"y"}))
    assert await primary.xlen(KEYS.updates) == 2


async def test_min_replicas_to_write_refuses_writes_and_scripts_as_a_transient_failover(
    tmp_path: Path,
) -> None:
    """Durable mode's server setting: a primary without a good replica refuses writes
    (NOREPLICAS) rather than take ones a failover would lose; a commit script is refused before
    it writes anything."""
    server = RedisServer(tmp_path / "alone")
    server.start()
    client = connect(RedisSettings(url=server.url, socket_timeout_s=5.0))
    try:
        await client.set(KEYS.epoch, 1)  # the aggregator's fence, raised before the refusals
        await client.config_set("min-replicas-to-write", 1)
        with pytest.raises(FailoverError, match="NOREPLICAS") as refused:
            await client.xadd(KEYS.updates, {"m": b"x"})
        assert isinstance(refused.value, TRANSIENT)
        committer = Committer(client, KEYS, epoch=1, seq=0, keep_versions=2)
        with pytest.raises(FailoverError, match="NOREPLICAS"):
            await committer.commit(Batch(b"state", 0, b"model"), now=1.0)
        assert await client.exists(KEYS.state, KEYS.version, KEYS.commit_seq) == 0
        assert await client.get(KEYS.epoch) == b"1"  # reads still answer
    finally:
        await client.aclose()
        server.stop()


async def test_a_durable_commit_is_announced_only_once_a_replica_holds_it(
    pair: Pair, primary: aioredis.Redis
) -> None:
    await wait_linked(pair, primary)
    await primary.set(KEYS.epoch, 1)
    record = pack({"update_id": "u", "client_id": "c0", "outcome": "applied"})
    batch = Batch(b"state", 1, b"model-1", ledger=[LedgerEntry(record, update_digest("c0", "u"))])
    committer = Committer(primary, KEYS, epoch=1, seq=0, keep_versions=2, durability=DURABLE)
    pair.replica.kill()
    with pytest.raises(NotReplicated):
        await committer.commit(batch, now=1.0)
    # committed on the primary, not announced, and the commit counts as not made yet
    assert await primary.get(KEYS.version) == b"1"
    assert await primary.get(KEYS.announced) is None
    assert committer.seq == 0
    pubsub = primary.pubsub()
    async with pubsub:
        await pubsub.subscribe(KEYS.versions_channel)
        assert (await pubsub.get_message(timeout=5.0) or {}).get("type") == "subscribe"
        pair.start_replica()
        await wait_linked(pair, primary)
        # the retry finds its commit in place, writes its sequence again and waits for that
        await committer.commit(batch, now=1.0)
        assert committer.seq == 1
        assert await primary.xlen(KEYS.ledger) == 1  # written once
        await committer.announce(batch.version)
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=10.0)
        assert message is not None
        assert message["data"] == b"1"
    assert await primary.get(KEYS.announced) == b"1"
    assert await on_replica(pair, "GET", KEYS.commit_seq) == b"1"
    # an older announcement never takes it back
    await committer.announce(0)
    assert await primary.get(KEYS.announced) == b"1"


async def test_the_ingest_service_acknowledges_an_update_once_a_replica_holds_it(
    pair: Pair, primary: aioredis.Redis
) -> None:
    await wait_linked(pair, primary)
    store = IngestStore(primary, KEYS, ttl_s=60, window_ms=300_000, durability=DURABLE)
    proof = Proof("c0", int(time.time() * 1000), b"\0" * 32)  # signed now: inside the window
    key = fingerprint(await add_device(primary, KEYS, "c0", HMAC))  # the key it was checked with
    pair.replica.kill()
    with pytest.raises(NotReplicated):  # the service answers 503 Retry-After: 1 (app.py)
        await store.add("c0", "u1", b"body", proof, key)
    pair.start_replica()
    await wait_linked(pair, primary)
    # the device's retry: the same update, found in place, and the WAIT now covers it
    again = await store.add("c0", "u1", b"body", proof, key)
    assert not again.new
    assert await primary.xlen(KEYS.updates) == 1
    held = await on_replica(pair, "XRANGE", KEYS.updates, again.entry_id, again.entry_id)
    assert isinstance(held, list)
    assert len(held) == 1


async def test_as_shipped_a_primary_cut_off_from_its_replica_refuses_writes_on_its_own(
    tmp_path: Path,
) -> None:
    """The shipped server settings (`min-replicas-to-write 1`, `min-replicas-max-lag 4`,
    docker/redis/entrypoint.sh): the replica frozen (SIGSTOP: its link stays open, it just
    goes silent, as across a partition), the primary stops counting it once it has not
    acknowledged for the max lag, and refuses writes with nobody telling it to, before the
    Sentinels' down-after (5 s) could end. Reads still answer. The replica thawed, writes are
    taken again."""
    primary = RedisServer(tmp_path / "primary", extra_args=("--repl-diskless-sync-delay", "0"))
    primary.start()
    pair = Pair(primary, RedisServer(tmp_path / "replica"))
    client = connect(RedisSettings(url=primary.url, socket_timeout_s=60.0))
    try:
        pair.start_replica()
        await wait_linked(pair, client)
        # as a shipped server starts (set once the replica is linked, so the link's first
        # write is not refused while the replica connects)
        await client.config_set("min-replicas-to-write", SHIPPED_MIN_REPLICAS_TO_WRITE)
        await client.config_set("min-replicas-max-lag", SHIPPED_MIN_REPLICAS_MAX_LAG_S)
        await client.xadd(KEYS.updates, {"m": b"taken"})  # a replica follows: taken
        assert pair.replica.process is not None
        pair.replica.process.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        refused = await refused_within(client, deadline_s=60.0)
        assert "NOREPLICAS" in str(refused)
        # the fault as meant: the refusal came only once the replica was silent past the lag
        assert time.monotonic() - frozen_at >= SHIPPED_MIN_REPLICAS_MAX_LAG_S - 1
        assert await client.xlen(KEYS.updates) == 1  # reads answer; nothing more was taken
        pair.replica.process.send_signal(signal.SIGCONT)
        # taken again once the replica acknowledges (the refusals meanwhile are transient)
        await retrying(
            "probe",
            lambda: replicated(
                client, Durability(1, 45_000), lambda c: c.set("{durable}:probe", 2)
            ),
            RedisSettings(url=primary.url, reconnect_attempts=60),
        )
    finally:
        if pair.replica.process is not None:
            pair.replica.process.send_signal(signal.SIGCONT)
        await client.aclose()
        drop(pair)


async def refused_within(client: aioredis.Redis, deadline_s: float) -> FailoverError:
    """Write until the primary refuses (polling, with a deadline); the refusal."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            await client.set("{durable}:probe", 1)
        except FailoverError as exc:
            return exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"the primary still takes writes after {deadline_s} s")


async def test_the_noise_secret_counts_only_once_a_replica_holds_it(
    pair: Pair, primary: aioredis.Redis
) -> None:
    """A DP run's secret made while the replica is away is not relied on (NotReplicated, the
    start-up is retried); the retry keeps the secret made, never draws another, and returns once
    the replica holds it: a failover cannot hand the run a new secret."""
    await wait_linked(pair, primary)
    pair.replica.kill()
    with pytest.raises(NotReplicated):
        await ensure_secret(primary, KEYS, DURABLE)
    made = await primary.get(KEYS.dp_secret)
    assert isinstance(made, bytes)
    assert len(made) == SECRET_BYTES
    pair.start_replica()
    await wait_linked(pair, primary)
    assert await ensure_secret(primary, KEYS, DURABLE) == (made, False)
    assert await on_replica(pair, "GET", KEYS.dp_secret) == made
