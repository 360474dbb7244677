"""Every Redis path of fedasync on a real Redis Cluster: three primaries, a replica each.

One cluster for the module (conftest `redis_cluster`: six processes). Each test has a run of its
own (`cluster_settings`: a key prefix, so a hash tag, per test) and durable mode on, as by
default with a cluster: every durable write and its WAIT go to the run's primary
(fedasync/client/cluster_link.py). The scripts are driven through the code that runs them in
production (an aggregator, the ingest service, the policy store, the lag correction); the
failover tests kill -9 a primary and start it again, so the next test finds six nodes (with
roles swapped).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from fedasync.client.redis_link import replicated
from fedasync.services.aggregator.commit import ANNOUNCE_SCRIPT
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.cluster import (
    LocalCluster,
    prefixes_on_distinct_primaries,
    process_state,
)
from fedasync.services.ingest.app import create_app as create_ingest_app
from fedasync.services.runtime import lua
from fedasync.services.runtime.redis_cluster import is_cluster, node_of, on_node_of
from fedasync.services.runtime.redis_conn import connect, retrying, until_sent
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores import policy_store
from fedasync.services.stores.backlog import correct_lag
from fedasync.services.stores.committed import read_committed
from fedasync.services.stores.device_keys import add_device, list_devices, revoke_device
from fedasync.services.stores.ledger import records, verify
from fedasync.services.stores.memory import read_memory
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import PATH, signed_headers
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import (
    initial_state,
    make_update,
    publish,
    start_snapshot,
    wait_for_ledger,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

#: a promotion takes the node timeout (2 s) and an election; a loaded machine more
PROMOTED_WITHIN_S = 60.0


def keys_of(settings: Settings) -> Keys:
    return Keys(settings.redis.key_prefix)


def with_aggregator(settings: Settings, **aggregator: Any) -> Settings:
    section = settings.aggregator.model_copy(update=aggregator)
    return settings.model_copy(update={"aggregator": section})


def with_redis(settings: Settings, **redis: Any) -> Settings:
    return settings.model_copy(update={"redis": settings.redis.model_copy(update=redis)})


def tag(keys: Keys) -> str:
    return "{" + keys.prefix + "}"


async def durable_publish(
    redis: aioredis.Redis, settings: Settings, update_id: str, base: int
) -> bytes:
    """XADD an update as a device does in durable mode: acknowledged once the replica holds it,
    retried on a failover."""
    keys = keys_of(settings)
    fields = stream_entry.build(encode_update(make_update(update_id, base)))

    async def xadd() -> bytes:
        async def write(client: aioredis.Redis) -> bytes:
            entry: bytes = await client.xadd(keys.updates, fields)  # type: ignore[arg-type]
            return entry

        return await replicated(redis, settings.redis.durability, write, key=keys.updates)

    return await retrying("XADD", xadd, settings.redis)


@pytest_asyncio.fixture
async def client(cluster_settings: Settings) -> AsyncIterator[aioredis.Redis]:
    redis = connect(cluster_settings.redis)
    try:
        yield redis
    finally:
        await redis.aclose()


@pytest.mark.asyncio
async def test_the_client_is_a_cluster_client_with_durable_mode_on(
    cluster_settings: Settings, client: aioredis.Redis, redis_cluster: LocalCluster
) -> None:
    keys = keys_of(cluster_settings)
    assert is_cluster(client)
    assert cluster_settings.redis.durability.replicas == 1
    await client.set(keys.version, b"0")
    primary = redis_cluster.primary_of(keys.version)
    assert node_of(client, keys.version).port == primary
    # keyless commands at the run's node: its PING, its INFO
    assert await on_node_of(client, keys.state, "PING") is True
    assert (await read_memory(client, key=keys.state)).used > 0


@pytest.mark.asyncio
async def test_an_aggregator_commits_and_prunes_models_in_the_runs_slot(
    cluster_settings: Settings, client: aioredis.Redis, redis_cluster: LocalCluster
) -> None:
    """commit.lua writes `{p}:model:N` and deletes the models past `keep_versions`, keys it
    builds itself rather than declares: on a cluster they are in the slot of the declared keys
    (one hash tag), so the script may touch them. Also announce.lua (durable mode announces
    after the WAIT), the replicated epoch INCR and XREADGROUP, and correct_lag.lua."""
    settings = with_aggregator(cluster_settings, keep_versions=2)
    keys = keys_of(settings)
    initial: Any = initial_state(settings)
    for i in range(5):  # one commit per version: each start of the aggregator commits one
        await publish(client, keys, make_update(f"u{i}", base=i, value=float(i)))
        result = await run_aggregator(
            settings, redis=client, initial=initial, handle_signals=False, burst=True
        )
        assert result.version == i + 1
        initial = None  # restored from Redis from now on
    primary = redis_cluster.primary_of(keys.state)
    # the kept models are there (the genesis model is never pruned), the pruned ones gone,
    # all on the run's primary
    held = [redis_cluster.read(primary, keys.model(v)) is not None for v in range(6)]
    assert held == [True, False, False, False, True, True]
    assert await client.zrange(keys.models, 0, -1) == [b"0", b"4", b"5"]
    assert int(await client.get(keys.announced) or 0) == 5
    assert int(await client.get(keys.epoch) or 0) == 5  # one per start
    # the replica holds the commit (durable mode: the WAIT on the primary's connection)
    replica = redis_cluster.replica_of(primary)
    assert redis_cluster.read(replica, keys.version) == b"5"
    assert await correct_lag(client, keys) == 0
    report = await verify(client, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()


@pytest.mark.asyncio
async def test_the_ingest_service_adds_updates_through_its_script(
    cluster_settings: Settings, client: aioredis.Redis
) -> None:
    """ingest.lua: `{p}:ingested:<sha>`, the stream and the device keys, one slot; a repeat
    is answered as a retry, not added twice."""
    keys = keys_of(cluster_settings)
    key = parse_key(await add_device(client, keys, "dev-a"))
    app = TestClient(TestServer(create_ingest_app(cluster_settings, client)))
    await app.start_server()
    try:
        body = encode_update(make_update("u1", 0, client="dev-a"))
        headers = signed_headers(key, "dev-a", int(time.time() * 1000), body)
        first = await app.post(PATH, data=body, headers=headers)
        again = await app.post(PATH, data=body, headers=headers)
        assert (first.status, again.status) == (202, 202)
        answers = [await first.json(), await again.json()]
        assert [a["retry"] for a in answers] == [False, True]
        assert answers[0]["entry_id"] == answers[1]["entry_id"]
        assert await client.xlen(keys.updates) == 1
    finally:
        await app.close()


@pytest.mark.asyncio
async def test_a_policy_change_and_the_transactions_run_in_the_runs_slot(
    cluster_settings: Settings, client: aioredis.Redis
) -> None:
    """policy_change.lua, and the WATCH/MULTI transactions: the committed read, the policy
    log's migration, adding and revoking a device key."""
    keys = keys_of(cluster_settings)
    initial = cluster_settings.policy.to_policy()
    current = await policy_store.ensure_policy(client, keys, initial)
    changed = current.evolve(gamma=0.25)
    await policy_store.change_policy(client, keys, changed, who="test", why="cluster", at=1.0)
    assert (await policy_store.read_policy(client, keys)).gamma == 0.25
    with pytest.raises(policy_store.PolicyConflict):
        await policy_store.change_policy(client, keys, changed, who="test", why="again", at=2.0)

    # the policy log kept as a stream by an old release, converted under WATCH
    old_log = Keys(keys.prefix + "-old")
    await client.xadd(
        old_log.policy_log,
        {
            "version": "1",
            "policy": policy_store._encode(initial),
            "who": "old",
            "why": "start",
            "at": "1.0",
        },
    )
    assert await policy_store.migrate_policy_log(client, old_log) == 1
    assert await client.type(old_log.policy_log) == b"list"

    await add_device(client, keys, "dev-b")
    assert "dev-b" in await list_devices(client, keys)
    assert await revoke_device(client, keys, "dev-b")

    for i in range(2):
        await publish(client, keys, make_update(f"u{i}", base=i))
    settings = cluster_settings
    await run_aggregator(
        settings, redis=client, initial=initial_state(settings), handle_signals=False, burst=True
    )
    committed = await read_committed(client, keys)
    assert committed.version == 2


@pytest.mark.asyncio
async def test_a_blocking_group_read_waits_for_an_entry_and_until_sent_sees_it_sent(
    cluster_settings: Settings, client: aioredis.Redis
) -> None:
    """XREADGROUP BLOCK is routed by its key and blocks on the run's primary; `until_sent` finds
    the command on the wire through the cluster client's own coroutines."""
    keys = keys_of(cluster_settings)
    await client.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
    reading = asyncio.create_task(
        client.xreadgroup(AGGREGATOR_GROUP, "c", {keys.updates: ">"}, count=1, block=3000)
    )
    await until_sent(reading)
    assert not reading.done()  # sent, and blocked: nothing to read yet
    writer = connect(cluster_settings.redis)
    try:
        added = await writer.xadd(keys.updates, {"m": b"x"})
    finally:
        await writer.aclose()
    reply: Any = await reading
    assert reply[0][1][0][0] == added


@pytest.mark.asyncio
async def test_the_versions_channel_is_heard_on_any_node(
    cluster_settings: Settings, client: aioredis.Redis, redis_cluster: LocalCluster
) -> None:
    """A PUBLISH from a script on the run's primary (announce.lua) reaches a subscriber of the
    channel's node and one of another primary: classic pub/sub is broadcast cluster-wide."""
    keys = keys_of(cluster_settings)
    await client.set(keys.state, b"")  # learn the slot map
    own = client.pubsub()
    other_node = next(
        n for n in client.get_primaries() if n.port != node_of(client, keys.state).port
    )
    other = client.pubsub(node=other_node)
    try:
        for pubsub in (own, other):
            await pubsub.subscribe(keys.versions_channel)
            confirmed = await pubsub.get_message(timeout=5.0)
            assert confirmed is not None
            assert confirmed["type"] == "subscribe"
        args = lua.ScriptArgs(version=7, channel=keys.versions_channel)
        await ANNOUNCE_SCRIPT(client, keys=[keys.announced], args=args.argv())
        for pubsub in (own, other):
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
            assert message is not None
            assert message["data"] == b"7"
    finally:
        await own.aclose()
        await other.aclose()


def fail_over(cluster: LocalCluster, key: str, fault: str = "kill") -> tuple[int, int, float]:
    """Kill -9 (or SIGSTOP: `fault` "pause") the primary of `key`'s slot; (its port, the
    promoted one's, seconds to the promotion). Run in a thread: the wait polls."""
    old = cluster.primary_of(key)
    victim = cluster.node_on(old)
    process = victim.process
    assert process is not None
    if fault == "kill":
        cluster.kill(victim)
        assert process.returncode == -9  # the kill happened
    else:
        cluster.pause(victim)
        assert process_state(process.pid) == "T"  # stopped, its sockets open
    new, waited = cluster.wait_promoted(old, key, PROMOTED_WITHIN_S)
    return old, new, waited


def recover(cluster: LocalCluster, old: int, fault: str = "kill") -> None:
    """Start the killed node again (as a replica of the promoted one), from the main thread: a
    child dies with the thread that started it (PR_SET_PDEATHSIG); or resume the paused one,
    which then hears it was replaced and turns replica."""
    if fault == "kill":
        cluster.restart(cluster.node_on(old))
    else:
        cluster.resume(cluster.node_on(old))
    cluster.wait_settled()


@pytest.mark.asyncio
async def test_a_script_is_loaded_on_its_keys_node_only_and_again_after_a_failover(
    cluster_settings: Settings, client: aioredis.Redis, redis_cluster: LocalCluster
) -> None:
    """SCRIPT LOAD goes to the node of the script's first key, not to every primary; scripts are
    not replicated, so the replica promoted by a failover answers NOSCRIPT, and the script is
    loaded there and run."""
    keys = keys_of(cluster_settings)
    nonce = hashlib.sha1(keys.prefix.encode()).hexdigest()
    script = lua.LuaScript("probe", f"-- {nonce}\nreturn redis.call('INCR', KEYS[1])")
    assert await script(client, [keys.epoch], []) == 1
    primary = redis_cluster.primary_of(keys.epoch)
    held = {
        port: redis_cluster._ask(port, "SCRIPT", "EXISTS", script.sha)[0]
        for port in redis_cluster.primaries()
    }
    assert held == {port: int(port == primary) for port in held}
    await asyncio.to_thread(redis_cluster._ask, primary, "WAIT", 1, 10_000)
    old, new, _ = await asyncio.to_thread(fail_over, redis_cluster, keys.epoch)
    try:
        assert redis_cluster._ask(new, "SCRIPT", "EXISTS", script.sha) == [0]
        assert (
            await retrying(
                "probe", lambda: script(client, [keys.epoch], []), cluster_settings.redis
            )
            == 2
        )
        assert redis_cluster._ask(new, "SCRIPT", "EXISTS", script.sha) == [1]
    finally:
        recover(redis_cluster, old)


@pytest.mark.asyncio
async def test_one_run_end_to_end_with_ledger_verify(
    cluster_settings: Settings,
    client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An aggregator running (not in burst mode) and the snapshot service, updates published in
    durable mode, then `fedasync ledger verify` against the cluster: OK."""
    settings = cluster_settings
    keys = keys_of(settings)
    stopping = asyncio.Event()
    listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    aggregator = asyncio.create_task(
        run_aggregator(
            settings,
            initial=initial_state(settings),
            handle_signals=False,
            stopping=stopping,
            started=listening,
        )
    )
    snapshot, url = await start_snapshot(settings, client, stopping)
    try:
        seen = "0-0"
        for i in range(4):
            await durable_publish(client, settings, f"u{i}", base=i)
            seen = await wait_for_ledger(client, keys, seen, 1)
        # the snapshot service hears of version 4 (its pub/sub through the cluster) and
        # answers the long-poll for a version above 3 with it
        async with ClientSession() as http:
            query = f"{url}/v1/models/latest/meta?newer_than=3&wait=30"
            async with http.get(query) as response:
                assert response.status == 200
                meta = await response.json()
            # committing, so restored: ready, its readiness PING answered by the run's node
            async with http.get(f"http://127.0.0.1:{await listening}/readyz") as response:
                assert response.status == 200
        assert meta.get("version") == 4
    finally:
        stopping.set()
        await asyncio.gather(aggregator, snapshot)
    for name, value in {
        "FEDASYNC_REDIS__URL": settings.redis.url,
        "FEDASYNC_REDIS__CLUSTER": settings.redis.cluster,
        "FEDASYNC_REDIS__KEY_PREFIX": keys.prefix,
        "FEDASYNC_TASK__NAME": "linear",
    }.items():
        monkeypatch.setenv(name, str(value))
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["ledger", "verify"]) == 0
    assert "OK" in capsys.readouterr().out.upper()


@pytest.mark.parametrize("fault", ["kill", "pause"])
@pytest.mark.asyncio
async def test_a_primary_lost_under_one_run_while_another_keeps_committing(
    redis_cluster: LocalCluster, request: pytest.FixtureRequest, fault: str
) -> None:
    """Two runs on two primaries, each with its aggregator and its durable publisher. The
    victim's primary is killed -9, or SIGSTOPped (a frozen host: its sockets stay open, a
    command sent there waits): the other run commits between the fault and the promotion (its
    client never waits on the lost node, not even to learn the slot map), and once the replica
    is promoted and the old primary is back as its replica, the victim's aggregator resumes;
    every update acknowledged to the victim's publisher is decided, none twice, and both
    ledgers verify."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    victim_run, bystander_run = prefixes_on_distinct_primaries(
        redis_cluster, [f"{fault}-{digest}-{i}" for i in range(20)]
    )
    runs = {
        run: load_settings(
            redis=redis_cluster.redis_settings(
                key_prefix=run, socket_timeout_s=5.0, reconnect_attempts=60
            ),
            task={"name": "linear"},
            aggregator={"batch_ms": 20, "block_ms": 100, "port": None},
        )
        for run in (victim_run, bystander_run)
    }
    clients = {run: connect(s.redis) for run, s in runs.items()}
    stopping = asyncio.Event()
    aggregators = {
        run: asyncio.create_task(
            run_aggregator(s, initial=initial_state(s), handle_signals=False, stopping=stopping)
        )
        for run, s in runs.items()
    }
    acknowledged: list[str] = []
    bystander_commits: list[float] = []  # monotonic times of the bystander's commits

    async def bystander() -> None:
        settings, redis = runs[bystander_run], clients[bystander_run]
        keys, seen, i = keys_of(settings), "0-0", 0
        while not stopping.is_set():
            await durable_publish(redis, settings, f"b{i}", base=i)
            seen = await wait_for_ledger(redis, keys, seen, 1)
            bystander_commits.append(time.monotonic())
            i += 1

    publishing = asyncio.create_task(bystander())
    victim, victim_client = runs[victim_run], clients[victim_run]
    victim_keys = keys_of(victim)
    old = redis_cluster.primary_of(tag(victim_keys))
    try:
        seen = "0-0"
        for i in range(3):
            await durable_publish(victim_client, victim, f"v{i}", base=i)
            acknowledged.append(f"v{i}")
            seen = await wait_for_ledger(victim_client, victim_keys, seen, 1)
        killed_at = time.monotonic()
        old, new, _ = await asyncio.to_thread(fail_over, redis_cluster, tag(victim_keys), fault)
        promoted_at = time.monotonic()
        assert new != old
        assert redis_cluster.primary_of(tag(keys_of(runs[bystander_run]))) != old
        # the bystander committed while the victim's slot had no primary
        assert any(killed_at < t < promoted_at for t in bystander_commits), bystander_commits
        recover(redis_cluster, old, fault)
        for i in range(3, 6):
            await durable_publish(victim_client, victim, f"v{i}", base=i)
            acknowledged.append(f"v{i}")
        await wait_for_ledger(victim_client, victim_keys, seen, 3)
        assert not aggregators[victim_run].done()
    finally:
        stopping.set()
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
        outcomes = await asyncio.gather(*aggregators.values(), return_exceptions=True)
    try:
        assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
        decided = [r["update_id"] async for r in records(victim_client, victim_keys)]
        assert set(acknowledged) <= set(decided), (acknowledged, decided)
        assert len(decided) == len(set(decided))  # none decided twice
        for run, settings in runs.items():
            report = await verify(clients[run], keys_of(settings), settings.wire.max_message_bytes)
            assert report.ok, report.describe()
    finally:
        for redis in clients.values():
            await redis.aclose()


@pytest.mark.asyncio
async def test_each_run_gets_a_cluster_client_of_its_own(
    cluster_settings: Settings, client: aioredis.Redis
) -> None:
    """runtime/run_clients: the default run shares the service's client, another run gets its
    own (so a topology reset after one run's failover touches no other run's client)."""
    default = cluster_settings.redis.key_prefix
    clients = RunClients(client, cluster_settings.redis, default)
    try:
        assert clients.for_run(default) is client
        other = clients.for_run(default + "-b")
        assert other is not client
        assert is_cluster(other)
        assert clients.for_run(default + "-b") is other
        await other.set(Keys(default + "-b").version, b"1")
        assert await client.get(Keys(default + "-b").version) == b"1"
    finally:
        await clients.aclose()


@pytest.mark.asyncio
async def test_the_snapshot_service_follows_through_a_client_it_alone_uses(
    cluster_settings: Settings, client: aioredis.Redis
) -> None:
    """The snapshot service's follower subscribes first thing, through the shared client, which
    nothing has used yet: a cluster's pub/sub needs the slot map, so the follower learns it
    (before, it failed at each try and the service never held a model, so never got ready)."""
    settings = cluster_settings
    keys = keys_of(settings)
    await run_aggregator(
        settings, redis=client, initial=initial_state(settings), handle_signals=False, burst=True
    )
    fresh = connect(settings.redis)  # the service's own client, used by nothing else
    stopping = asyncio.Event()
    snapshot, url = await start_snapshot(settings, fresh, stopping)
    try:
        async with ClientSession() as http:
            deadline = time.monotonic() + PROMOTED_WITHIN_S
            while True:
                async with http.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        break
                assert time.monotonic() < deadline, "the snapshot service never got ready"
                await asyncio.sleep(0.1)
            await publish(client, keys, make_update("u0", base=0))
            await run_aggregator(settings, redis=client, handle_signals=False, burst=True)
            query = f"{url}/v1/models/latest/meta?newer_than=0&wait=30"
            async with http.get(query) as response:
                assert response.status == 200
                assert (await response.json())["version"] == 1
            async with http.get(f"{url}/metrics") as response:
                text = await response.text()
        failures = [
            line
            for line in text.splitlines()
            if line.startswith("fedasync_snapshot_follow_failures_total{")
        ]
        assert all(line.endswith(" 0.0") for line in failures), failures
    finally:
        stopping.set()
        await snapshot
        await fresh.aclose()


def test_a_cluster_of_one_primary_and_its_replica(tmp_path: Any) -> None:
    """LocalCluster makes a cluster of fewer than three primaries itself (`redis-cli --cluster
    create` wants three): one primary holding every slot, its replica in sync."""
    cluster = LocalCluster(tmp_path / "small", primaries=1)
    try:
        cluster.start()
        primary, replica = (node.port for node in cluster.nodes)
        assert cluster.primaries() == [primary]
        assert cluster.replica_of(primary) == replica
        assert cluster.slot_owners() == {0: primary}
        assert cluster.primary_of("{any-run}:state") == primary
    finally:
        cluster.stop()
