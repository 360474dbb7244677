"""Following the primary across a Sentinel failover: real servers, real Sentinels, kill -9.

One replicated Redis for the module (services/commands/redis_launch/sentinel.py): a primary, two
replicas and three Sentinels, under the generated ACL file, every client logged in as its own user
and asking the Sentinels as `discovery`. Each test kills the primary of the moment and starts the
killed server again as a replica, so the next test finds the group whole.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.sentinel import Auth, ReplicatedRedis, Topology
from fedasync.services.runtime.redis_conn import FailoverError, connect, retrying
from fedasync.services.runtime.sentinel_channels import SWITCH_MASTER
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.acl import (
    DISCOVERY_USER,
    all_users,
    sentinel_users,
)
from fedasync.services.stores.alerts import STATE_MISMATCH
from fedasync.services.stores.ledger import records, verify
from fedasync.shared.continuity import Check
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, make_update, publish, wait_for_ledger

pytestmark = pytest.mark.integration

PREFIX = "ha"
KEYS = Keys(PREFIX)
ADMIN = ("admin-of-tests", "admin-of-tests-password-0")
PASSWORDS = {u.name: secrets.token_urlsafe(24) for u in (*all_users(PREFIX), *sentinel_users())}
#: generous: Sentinel needs its down-after (5 s) and an election; a loaded machine more
PROMOTED_WITHIN_S = 90.0
SETTLED_WITHIN_S = 90.0


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    replicated = ReplicatedRedis(
        tmp_path_factory.mktemp("replicated"),
        Topology(master_name=PREFIX),
        Auth.generated(PREFIX, PASSWORDS, ADMIN),
    )
    try:
        replicated.start(SETTLED_WITHIN_S)
        yield replicated
    finally:
        replicated.stop()


def as_user(group: ReplicatedRedis, user: str, **redis_settings: Any) -> Settings:
    """A service's settings: the Sentinels to ask (as `discovery`), its own user on the
    primary; the URL names no server. Durable mode as by default with Sentinels (on) unless
    `redis_settings` say otherwise."""
    return load_settings(
        redis={
            "url": f"redis://{user}:{PASSWORDS[user]}@primary/0",
            "sentinels": group.sentinel_addresses,
            "master_name": PREFIX,
            "sentinel_username": DISCOVERY_USER,
            "sentinel_password": PASSWORDS[DISCOVERY_USER],
            "key_prefix": PREFIX,
            "socket_timeout_s": 2.0,
            # ride out a slow failover (an election retried, Sentinel's TILT mode on a stalled
            # machine) rather than give up after the default ten tries, about 13 s
            "reconnect_attempts": 60,
            **redis_settings,
        },
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": None},
    )


def admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=ADMIN[0], password=ADMIN[1], socket_timeout=60.0)


def on(port: int, *command: Any) -> Any:
    client = admin(port)
    try:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def fail_over(group: ReplicatedRedis) -> tuple[int, int]:
    """Kill -9 the primary; (its address, the promoted one's) once the Sentinels promoted."""
    old = group.primary_port()
    group.kill(group.server_on(old))
    new, _ = group.wait_promoted(old, PROMOTED_WITHIN_S)
    return old, new


def recover(group: ReplicatedRedis, old: int) -> None:
    """Start the killed server again, from the main thread: a child process dies with the
    thread that started it (PR_SET_PDEATHSIG), and a loop's worker threads end with the test."""
    group.restart(group.server_on(old))
    group.wait_settled(SETTLED_WITHIN_S)


@pytest.mark.asyncio
async def test_a_service_follows_the_primary_across_a_kill_9(group: ReplicatedRedis) -> None:
    settings = as_user(group, "worker")
    client = connect(settings.redis)
    try:
        first = await client.xadd(KEYS.updates, {"m": b"before"})
        # everything up to here is on both replicas: the failover below loses none of it
        on(group.primary_port(), "WAIT", 2, 30_000)
        old, new = await asyncio.to_thread(fail_over, group)
        assert new != old
        # the next command fails on the dead primary (a transient error), the retry policy
        # asks the Sentinels again and it lands on the new one: no restart, no new client
        second = await retrying(
            "XADD", lambda: client.xadd(KEYS.updates, {"m": b"after"}), settings.redis
        )
        held = on(new, "XRANGE", KEYS.updates, "-", "+")
        assert [row[0] for row in held] == [first, second]
    finally:
        await client.aclose()
        recover(group, old)


@pytest.mark.asyncio
async def test_a_commit_lost_in_a_failover_stops_the_aggregator_and_a_restart_resumes(
    group: ReplicatedRedis,
) -> None:
    """docs/architecture.md, "Past one machine": replication is asynchronous, so the primary can
    die with a commit (and an XADD) no replica has. The aggregator that made that commit finds an
    older commit sequence on the new primary: its next commit is refused, it raises the
    state-mismatch alarm and stops (exit code 4); a restarted aggregator resumes from what the
    new primary holds, and `ledger verify` passes. The replicas are cut off by the ACL
    (`replica` switched off on the primary, their links dropped) so that they miss it for
    certain. Durable mode explicitly off: on (the default with Sentinels), u2 would not have
    been acknowledged nor commit 2 announced."""
    settings = as_user(group, "aggregator", durable_replicas=0)
    worker = connect(as_user(group, "worker", durable_replicas=0).redis)
    stopping = asyncio.Event()
    first = asyncio.create_task(
        run_aggregator(
            settings, initial=initial_state(settings), handle_signals=False, stopping=stopping
        )
    )
    old = group.primary_port()
    watcher = connect(load_settings(redis={"url": admin_url(old), "socket_timeout_s": 30}).redis)
    try:
        await publish(worker, KEYS, make_update("u1", base=0))
        seen = await wait_for_ledger(watcher, KEYS, "0-0", 1)
        on(old, "WAIT", 2, 30_000)  # commit 1 (and u1) on both replicas
        on(old, "ACL", "SETUSER", "replica", "off")
        on(old, "CLIENT", "KILL", "TYPE", "replica")
        await publish(worker, KEYS, make_update("u2", base=1))  # acknowledged by the primary
        await wait_for_ledger(watcher, KEYS, seen, 1)  # commit 2: on the primary only
        await watcher.aclose()
        _, new = await asyncio.to_thread(fail_over, group)
        await retrying(
            "publish", lambda: publish(worker, KEYS, make_update("u3", base=1)), settings.redis
        )
        with pytest.raises(StateMismatch) as refused:
            await asyncio.wait_for(first, 120)
        assert [p.check for p in refused.value.problems] == [Check.COMMIT_SEQ_MOVED]
        alerts = on(new, "XRANGE", KEYS.alerts, "-", "+")
        assert [dict(a[1])[b"rule"] for a in alerts] == [STATE_MISMATCH.encode()]
        # the restart resumes from commit 1 and decides u3: u2 was lost with the old primary
        result = await run_aggregator(settings, handle_signals=False, burst=True)
        assert result.version == 2
        reader = connect(load_settings(redis={"url": admin_url(new)}).redis)
        try:
            decided = [r["update_id"] async for r in records(reader, KEYS)]
            assert decided == ["u1", "u3"]
            report = await verify(reader, KEYS, 1 << 24)
            assert report.ok, report.describe()
        finally:
            await reader.aclose()
    finally:
        stopping.set()
        if not first.done():
            first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await worker.aclose()
        await watcher.aclose()
        recover(group, old)


def wait_subscribed(group: ReplicatedRedis, within_s: float = SETTLED_WITHIN_S) -> None:
    """Until every Sentinel has a subscriber to `+switch-master` (the client's watch)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        # Sentinels have no PUBSUB command: their subscribed clients, by user
        listed = [on(port, "CLIENT", "LIST", "TYPE", "pubsub") for port in group.sentinel_ports]
        if all(f"user={DISCOVERY_USER}" in _text(text) for text in listed):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no {SWITCH_MASTER} subscriber on every Sentinel in {within_s} s")


@pytest.mark.asyncio
async def test_a_command_in_flight_on_a_paused_primary_fails_once_the_sentinels_replace_it(
    group: ReplicatedRedis,
) -> None:
    """SIGSTOP of the primary past the Sentinels' down-after: they promote a replica while the
    old primary still holds the client's open connection, with an XADD waiting in it. Once they
    announce the switch (`+switch-master`) the client closes that connection: the XADD fails as
    a lost connection (transient) while the old primary is still frozen, not when it thaws and,
    still a primary in its own eyes, would have taken and acknowledged it (to lose it at its
    demotion). Its retry lands on the new primary. The socket timeout is far above the whole
    wait, so only the switch can end the XADD."""
    settings = as_user(group, "worker", socket_timeout_s=300.0)
    client = connect(settings.redis)
    old = group.primary_port()
    frozen = group.server_on(old)
    try:
        await client.xadd(KEYS.updates, {"m": b"before"})
        await asyncio.to_thread(wait_subscribed, group)
        group.pause(frozen)
        paused_at = time.monotonic()
        in_flight: asyncio.Future[Any] = asyncio.ensure_future(
            client.xadd(KEYS.updates, {"m": b"in flight"})
        )
        new, _ = await asyncio.to_thread(group.wait_promoted, old, PROMOTED_WITHIN_S)
        # the fault happened: frozen past down-after, and a replica promoted meanwhile
        assert time.monotonic() - paused_at > group.topology.down_after_ms / 1000
        assert new != old
        done, _ = await asyncio.wait({in_flight}, timeout=PROMOTED_WITHIN_S)
        assert in_flight in done, "the XADD still waits on the frozen primary"
        with pytest.raises(RedisConnectionError):
            in_flight.result()
    finally:
        group.resume(frozen)
    try:
        after = await retrying(
            "XADD", lambda: client.xadd(KEYS.updates, {"m": b"after"}), settings.redis
        )
        assert after in [row[0] for row in on(new, "XRANGE", KEYS.updates, "-", "+")]
    finally:
        await client.aclose()
        await asyncio.to_thread(group.wait_settled, SETTLED_WITHIN_S)


@pytest.mark.asyncio
async def test_a_new_connection_to_a_server_that_is_no_primary_is_refused_as_a_failover(
    group: ReplicatedRedis,
) -> None:
    """The role check on every new connection: the Sentinels' answer can be a moment old (the
    server they named has been demoted since). A read there would answer, from a replica, with
    whatever it holds; the connection asks the server's role first (HELLO) and refuses it as a
    failover, transient, so the retry asks the Sentinels again. The stale answer is made by
    handing the pool a replica's address instead of the Sentinels' reply."""
    settings = as_user(group, "snapshot")
    client = connect(settings.redis)
    primary = group.primary_port()
    replica = next(
        group.address(s)
        for s in group.servers
        if s.process is not None and group.address(s) != primary
    )
    assert group.replication(replica)["role"] == "slave"  # a replica, answering

    async def named_a_moment_ago() -> tuple[str, int]:
        return "127.0.0.1", replica

    pool: Any = client.connection_pool  # a WatchedSentinelPool
    pool.get_master_address = named_a_moment_ago
    try:
        with pytest.raises(FailoverError, match="not as the primary"):
            await client.get(KEYS.version)
    finally:
        await client.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def admin_url(port: int) -> str:
    return f"redis://{ADMIN[0]}:{ADMIN[1]}@127.0.0.1:{port}/0"


@pytest.fixture(autouse=True)
def _fresh_keys(group: ReplicatedRedis) -> None:
    """Each test starts from no fedasync key at all."""
    client = admin(group.primary_port())
    try:
        keys = list(client.scan_iter(match="{ha}:*"))
        if keys:
            client.delete(*keys)
        client.execute_command("WAIT", 2, 30_000)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def test_the_cli_finds_the_primary_through_the_sentinels(
    group: ReplicatedRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedasync devices` as the `admin` user, told only where the Sentinels are."""
    for name, value in {
        "FEDASYNC_REDIS__URL": f"redis://admin:{PASSWORDS['admin']}@primary/0",
        "FEDASYNC_REDIS__SENTINELS": group.sentinel_addresses,
        "FEDASYNC_REDIS__MASTER_NAME": PREFIX,
        "FEDASYNC_REDIS__SENTINEL_USERNAME": DISCOVERY_USER,
        "FEDASYNC_REDIS__SENTINEL_PASSWORD": PASSWORDS[DISCOVERY_USER],
        "FEDASYNC_REDIS__KEY_PREFIX": PREFIX,
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["devices", "add", "device-7"]) == 0
    capsys.readouterr()
    assert main(["devices", "list"]) == 0
    assert "device-7" in capsys.readouterr().out
    assert on(group.primary_port(), "HEXISTS", KEYS.device_keys, "device-7") == 1
