"""Issue 12, item 0: when Redis moves back in time, the services say so and refuse to go on.

Two ways Redis can move back, both made here for real: an AOF that lost its MULTI/EXEC blocks
(what Redis 7.0 replayed under a restricted default user: every commit gone, every plain write
kept), and a restart on a copy of an older AOF (a restore from backup: whole, but older). Each
test first shows the fault happened, then the outcome: the aggregator refuses (exception, exit
code 4, metric, alert, /readyz) a state that contradicts its ledger, group or start time, and a
commit that finds the sequence moved; the snapshot service, having served version N, freezes on
seeing less (metric, alert, /readyz 503, nothing newer announced). A normal restart is never
flagged: tests/integration/test_crash_recovery.py, test_acl.py and the chaos profiles restart
the aggregator and Redis many times through this check.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from redis.exceptions import NoPermissionError

from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.service import Aggregator
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.chaos.probe import wait_served
from fedasync.services.commands.chaos.restarts import compare, read_marks
from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.entry import EXIT_REFUSED
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.snapshot.app import CACHE, METRICS, create_app, refresh, wait_ready
from fedasync.services.stores.acl import acl_file, all_users, users
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.shared.continuity import Check
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import decode_model
from tests.integration.aof import drop_transactions, incremental_files
from tests.integration.helpers import (
    initial_state,
    make_update,
    next_entries,
    publish,
    wait_for_ledger,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "back"
KEYS = Keys(PREFIX)
MISMATCHES = "fedasync_aggregator_state_mismatches_total"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own: it is killed and its files are edited."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    try:
        yield redis_server
    finally:
        redis_server.stop()


def settings_for(server: RedisServer, **aggregator: Any) -> Settings:
    return load_settings(
        redis={"url": server.url, "key_prefix": PREFIX, "socket_timeout_s": 5.0},
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": None} | aggregator,
    )


@pytest_asyncio.fixture
async def observer(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A raw client: it plays the fault and reads what services cannot."""
    client = connect(settings_for(server).redis)
    try:
        yield client
    finally:
        await client.aclose()


async def commit(settings: Settings, redis: aioredis.Redis, ids: list[str]) -> int:
    """Publish updates trained from the current version, decide them; the new version."""
    version = int(await redis.get(KEYS.version) or 0)
    for update_id in ids:
        await publish(redis, KEYS, make_update(update_id, base=version))
    first = None if await redis.exists(KEYS.commit_seq) else initial_state(settings)
    result = await run_aggregator(
        settings, redis=redis, initial=first, handle_signals=False, burst=True
    )
    return result.version


async def next_alert(redis: aioredis.Redis, after: str = "0-0") -> dict[str, str]:
    """Block (no polling) until an alert is recorded; its fields."""
    _, fields = (await next_entries(redis, KEYS.alerts, after, 30.0, count=1))[0]
    return {k.decode(): v.decode() for k, v in fields.items()}


# ------------------------------------------------------------------------------- aggregator
@pytest.mark.parametrize("read_count", [1, 64], ids=["single-reads", "batched-reads"])
async def test_the_aggregator_refuses_a_redis_that_lost_its_transactions(
    server: RedisServer, observer: aioredis.Redis, read_count: int
) -> None:
    """The observed failure: Redis kept the plain writes and lost every MULTI/EXEC. Reads of one
    entry are logged as a plain XCLAIM (the group stays ahead, with entries pending); reads of
    several as a transaction (the group is back at 0-0). Either way the start time, written
    after the first commit on its own, is there beside commit sequence 0."""
    settings = settings_for(server, read_count=read_count)
    version = await commit(settings, observer, [f"u{i}" for i in range(6)])
    assert version == 6
    await observer.aclose()
    server.kill()
    dropped = 0
    for path in incremental_files(server.directory):
        kept, count = drop_transactions(path.read_bytes())
        path.write_bytes(kept)
        dropped += count
    server.start()
    redis = connect(settings.redis)
    try:
        # the fault: every commit is gone, the updates and the start time are not
        assert dropped >= 2
        assert await redis.get(KEYS.commit_seq) is None
        assert await redis.xlen(KEYS.ledger) == 0
        assert await redis.get(KEYS.version) is None
        assert await redis.xlen(KEYS.updates) == 6
        assert await redis.exists(KEYS.started)
        genesis = await redis.get(KEYS.genesis)

        aggregator = Aggregator(settings, redis, KEYS)
        with pytest.raises(StateMismatch) as refused:
            await aggregator.start(None)

        checks = {p.check for p in refused.value.problems}
        assert Check.STARTED_WITHOUT_COMMIT in checks
        if read_count == 1:
            assert Check.GROUP_AHEAD_OF_GENESIS in checks
        sample = aggregator.metrics.registry.get_sample_value
        for check in Check:
            assert sample(MISMATCHES, {"check": check.value}) == (1.0 if check in checks else 0.0)
        assert aggregator.ready.refused is not None
        assert not aggregator.ready.ready
        alert = await next_alert(redis)
        assert alert["rule"] == STATE_MISMATCH
        assert Check.STARTED_WITHOUT_COMMIT.value in alert["message"]
        # and it wrote nothing: no genesis commit, no decision, the old genesis untouched
        assert await redis.get(KEYS.commit_seq) is None
        assert await redis.xlen(KEYS.ledger) == 0
        assert await redis.get(KEYS.genesis) == genesis
        # `run` (what the entry point calls) refuses the same way
        with pytest.raises(StateMismatch):
            await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
        assert await redis.xlen(KEYS.ledger) == 0
    finally:
        await redis.aclose()


async def test_a_first_start_that_stopped_before_its_first_commit_is_no_false_alarm(
    tmp_path: Path,
) -> None:
    """What a first start writes before its first commit (epoch, group, policy, genesis) is not a
    move back in time: a start that stops right there is followed by a normal one. The stop is
    real: the first aggregator runs as a user without EVALSHA, so its first commit is refused."""
    passwords = {user.name: f"{user.name}-test-password-0" for user in all_users(PREFIX)}
    aggregator = next(user for user in users(PREFIX) if user.name == "aggregator")
    no_commit = aggregator.rules().replace(" +evalsha", "")
    acl = tmp_path / "users.acl"
    acl.write_text(
        acl_file(PREFIX, passwords)
        + f"user nocommit on >nocommit-pw-00000 {no_commit}\n"
        + "user observer on >observer-pw-0000 ~* &* +@all\n"
    )
    server = RedisServer(tmp_path / "redis", extra_args=("--aclfile", str(acl)))
    server.start()

    def as_user(user: str, password: str) -> Settings:
        url = f"redis://{user}:{password}@127.0.0.1:{server.port}/0"
        return load_settings(
            redis={"url": url, "key_prefix": PREFIX, "socket_timeout_s": 5.0},
            task={"name": "linear"},
            aggregator={"batch_ms": 20, "block_ms": 100, "port": None},
        )

    observer = connect(as_user("observer", "observer-pw-0000").redis)
    try:
        await publish(observer, KEYS, make_update("a", base=0))
        with pytest.raises(NoPermissionError):
            await run_aggregator(
                as_user("nocommit", "nocommit-pw-00000"), handle_signals=False, burst=True
            )
        # the fault: stopped between its first writes and its first commit
        assert await observer.get(KEYS.genesis) is not None
        assert await observer.get(KEYS.commit_seq) is None
        assert not await observer.exists(KEYS.started)

        await run_aggregator(
            as_user("aggregator", passwords["aggregator"]), handle_signals=False, burst=True
        )
        assert int(await observer.get(KEYS.commit_seq) or 0) >= 1
        assert await observer.xlen(KEYS.ledger) == 1  # the update is decided
        assert await observer.xlen(KEYS.alerts) == 0
        assert await observer.exists(KEYS.started)
    finally:
        await observer.aclose()
        server.stop()


def aggregator_process(settings: Settings, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env |= {
        "FEDASYNC_REDIS__URL": str(settings.redis.url),
        "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "FEDASYNC_TASK__NAME": settings.task.name,
        "FEDASYNC_AGGREGATOR__PORT": str(port),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fedasync.services.aggregator"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_a_refusing_aggregator_process_says_why_and_exits_with_code_4(
    server: RedisServer, observer: aioredis.Redis, tmp_path: Path
) -> None:
    """The process: /readyz 503 with the reason and the metric while it lingers, an alert, and
    exit code 4 (not 3, not a traceback) once stopped."""
    settings = settings_for(server)
    version = await commit(settings, observer, ["a", "b", "c"])
    await observer.set(KEYS.version, version - 1)  # the version key went back, the state did not
    port = free_port()
    process = aggregator_process(settings, port, tmp_path / "aggregator.log")
    try:
        alert = await next_alert(observer)  # recorded before it answers 503 with the reason
        assert alert["rule"] == STATE_MISMATCH
        assert "state-version" in alert["message"]
        status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/readyz")
        deadline = asyncio.get_running_loop().time() + 30
        while "refused" not in body:  # the HTTP side starts before the check runs
            assert process.poll() is None, (tmp_path / "aggregator.log").read_text()
            assert asyncio.get_running_loop().time() < deadline, body
            status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/readyz")
        assert status == 503
        assert f"state at version {version}, version key {version - 1}" in body
        _, metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        assert f'{MISMATCHES}{{check="state-version",run="{PREFIX}"}} 1.0' in metrics
        assert process.poll() is None  # it lingers for the scrape
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == EXIT_REFUSED == 4
    log = (tmp_path / "aggregator.log").read_text()
    assert "refusing to decide" in log
    assert "Traceback" not in log
    assert await observer.xlen(KEYS.ledger) == 3  # nothing decided after the refusal


async def test_a_commit_that_finds_the_sequence_moved_refuses(
    server: RedisServer, observer: aioredis.Redis
) -> None:
    """A running aggregator whose Redis lost commits under it (the sequence went back to 0)
    stops at its next commit with the same alarm, instead of a bare conflict."""
    settings = settings_for(server)
    await commit(settings, observer, ["a"])
    aggregator = Aggregator(settings, observer, KEYS)
    await aggregator.start(None)
    stopping = asyncio.Event()
    running = asyncio.create_task(aggregator.run(stopping))
    try:
        await publish(observer, KEYS, make_update("b", base=1))
        await wait_for_ledger(observer, KEYS, "0-0", 2)
        for key in (KEYS.commit_seq, KEYS.state, KEYS.version):  # the fault: commits lost
            await observer.delete(key)
        await publish(observer, KEYS, make_update("c", base=2))
        with pytest.raises(StateMismatch) as refused:
            await asyncio.wait_for(running, 30)
    finally:
        stopping.set()
        if not running.done():
            await asyncio.wait_for(running, 30)
    assert [p.check for p in refused.value.problems] == [Check.COMMIT_SEQ_MOVED]
    sample = aggregator.metrics.registry.get_sample_value
    assert sample(MISMATCHES, {"check": Check.COMMIT_SEQ_MOVED.value}) == 1.0
    alert = await next_alert(observer)
    assert alert["rule"] == STATE_MISMATCH
    assert "commit sequence is 0" in alert["message"]


# --------------------------------------------------------------------------- snapshot service
@pytest_asyncio.fixture
async def snapshot(
    server: RedisServer, observer: aioredis.Redis
) -> AsyncIterator[tuple[TestClient, Settings]]:
    """The snapshot app on this test's server, serving version 3 (an own client: the test
    kills the server under it)."""
    settings = settings_for(server)
    for update_id in ("a", "b", "c"):  # one commit each: versions 1, 2 and 3 are all kept
        await commit(settings, observer, [update_id])
    client = connect(settings.redis)
    app = create_app(settings, client)
    try:
        async with TestClient(TestServer(app)) as test_client:
            await wait_ready(app)
            yield test_client, settings
    finally:
        await client.aclose()


async def test_the_snapshot_service_freezes_when_redis_reports_an_older_version(
    snapshot: tuple[TestClient, Settings], observer: aioredis.Redis
) -> None:
    client, _ = snapshot
    app = client.server.app
    served = await client.get("/v1/models/latest")
    assert served.headers["X-Fedasync-Version"] == "3"
    served_body = await served.read()
    assert (await client.get("/v1/models/2")).status == 200  # read from Redis on demand

    # the fault: Redis reports version 1 and announces it, as a restored older copy would
    await observer.set(KEYS.version, 1)
    await observer.publish(KEYS.versions_channel, 1)

    alert = await next_alert(observer)
    assert alert["rule"] == VERSION_REGRESSED
    assert alert["message"] == "Redis reports version 1, below version 3 already served"
    metrics = await (await client.get("/metrics")).text()
    assert f'fedasync_snapshot_version_regressed{{run="{PREFIX}"}} 1.0' in metrics
    assert f'fedasync_snapshot_model_version{{run="{PREFIX}"}} 3.0' in metrics
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert (await ready.json())["status"] == "version regressed"
    # it keeps serving what it holds, the same bytes
    latest = await client.get("/v1/models/latest")
    assert latest.status == 200
    assert await latest.read() == served_body
    assert (await client.get("/v1/models/3")).status == 200
    assert (await client.get("/v1/models/2")).status == 200  # held in memory since it was read
    # and nothing it would have to take from Redis now: the numbers may name other models
    refused = await client.get("/v1/models/1")
    assert refused.status == 503
    assert "only versions held in memory" in (await refused.json())["error"]
    # a later version is not announced either: the history it would continue is not ours
    await observer.set(KEYS.version, 9)
    await observer.set(KEYS.model(9), await observer.get(KEYS.model(3)) or b"")
    await refresh(app)
    assert app[CACHE].latest is not None
    assert app[CACHE].latest.version == 3
    assert (await client.get("/v1/models/latest?newer_than=3&wait=0")).status == 204
    # said once, not at every refresh
    assert await observer.xlen(KEYS.alerts) == 1
    regressed = app[METRICS].registry.get_sample_value(
        "fedasync_snapshot_version_regressed", {"run": KEYS.prefix}
    )
    assert regressed == 1.0


async def test_redis_restarted_on_an_older_aof(
    server: RedisServer, observer: aioredis.Redis, tmp_path: Path
) -> None:
    """A restore from an older backup: whole, so the aggregator cannot tell (its state, ledger and
    group agree) and starts from it, and numbers it then commits name other models than the
    ones already served. The snapshot service, which served the newer version, can tell."""
    settings = settings_for(server)
    assert await commit(settings, observer, ["a", "b"]) == 2
    backup = tmp_path / "backup"
    shutil.copytree(server.directory / "appendonlydir", backup)  # fsynced at every write
    assert await commit(settings, observer, ["c", "d", "e"]) == 5
    redis = connect(settings.redis)
    after = connect(settings.redis)  # a client for after the restart: no stale connection
    app = create_app(settings, redis)
    try:
        async with TestClient(TestServer(app)) as client:
            await wait_ready(app)
            assert app[CACHE].latest is not None
            assert app[CACHE].latest.version == 5
            served = await (await client.get("/v1/models/latest")).read()

            server.kill()
            shutil.rmtree(server.directory / "appendonlydir")
            shutil.copytree(backup, server.directory / "appendonlydir")
            server.start()
            # the fault: Redis is back at version 2
            assert int(await after.get(KEYS.version) or 0) == 2

            alert = await next_alert(after)  # the service resubscribes and re-reads
            assert alert["rule"] == VERSION_REGRESSED
            assert alert["message"] == "Redis reports version 2, below version 5 already served"
            assert (await client.get("/readyz")).status == 503

            # the aggregator starts on the older copy (it agrees with itself) and commits 3..4
            assert await commit(settings, after, ["f", "g"]) == 4
            other = decode_model(await after.get(KEYS.model(4)) or b"").snapshot
            assert other.version == 4
            await refresh(app)
            latest = await client.get("/v1/models/latest")
            assert latest.headers["X-Fedasync-Version"] == "5"
            assert await latest.read() == served  # never the new history's numbers
            assert (await client.get("/v1/models/4")).status == 503
            assert await after.xlen(KEYS.alerts) == 1  # the aggregator did not alert
    finally:
        await redis.aclose()
        await after.aclose()


# ------------------------------------------------------------------ the chaos harness's check
async def test_the_chaos_restart_check_tells_an_intact_restart_from_a_lossy_one(
    tmp_path: Path,
) -> None:
    """chaos/restarts.py on a real Redis under the ACL file, as `fedasync chaos` runs it: a kill -9
    and restart keeps everything; the same restart on an AOF that lost its transactions is
    reported, from the comparison and from the aggregator's own check. (The harness is
    synchronous: its readings run in a thread here.)"""
    passwords = {user.name: f"{user.name}-test-password-0" for user in all_users(PREFIX)}
    acl = tmp_path / "users.acl"
    acl.write_text(acl_file(PREFIX, passwords) + "user observer on >observer-pw-0000 ~* &* +@all\n")
    server = RedisServer(tmp_path / "redis", extra_args=("--aclfile", str(acl)))
    server.start()
    observer_url = f"redis://observer:observer-pw-0000@127.0.0.1:{server.port}/0"
    settings = load_settings(
        redis={
            "url": f"redis://aggregator:{passwords['aggregator']}@127.0.0.1:{server.port}/0",
            "key_prefix": PREFIX,
            "socket_timeout_s": 5.0,
        },
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": None, "read_count": 1},
    )

    async def commit_as_aggregator(ids: list[str]) -> None:
        observer = connect(settings.redis, observer_url)
        try:
            for update_id in ids:
                await publish(observer, KEYS, make_update(update_id, base=0))
        finally:
            await observer.aclose()
        await run_aggregator(settings, handle_signals=False, burst=True)

    try:
        await commit_as_aggregator(["a", "b", "c"])
        before = await asyncio.to_thread(read_marks, observer_url, KEYS, unpause=False)
        server.restart()  # kill -9, same files
        after = await asyncio.to_thread(read_marks, observer_url, KEYS, before)
        assert compare(before, after, keep_versions=20) == []
        assert after.found.commit_seq == before.found.commit_seq >= 2

        await commit_as_aggregator(["d", "e"])
        before = await asyncio.to_thread(read_marks, observer_url, KEYS, unpause=False)
        server.kill()
        for path in incremental_files(server.directory):
            path.write_bytes(drop_transactions(path.read_bytes())[0])
        server.start()
        after = await asyncio.to_thread(read_marks, observer_url, KEYS, before)
        problems = compare(before, after, keep_versions=20)
        assert any("commit sequence went back" in p for p in problems), problems
        assert any("started-without-commit" in p for p in problems), problems
        assert any("ledger entry" in p for p in problems), problems
    finally:
        server.stop()


async def test_the_chaos_probe_does_not_take_a_frozen_newer_version_for_the_committed_one(
    snapshot: tuple[TestClient, Settings], observer: aioredis.Redis
) -> None:
    """After a failover that lost commits, the snapshot service freezes at a version Redis no
    longer holds: serving *more* than Redis is not serving what it holds. The probe keeps
    supervising (its `tick` restarts a frozen service) and reports the difference at its
    deadline instead of passing at once (a CI run saw served 116 against committed 114)."""
    client, settings = snapshot
    base_url = str(client.make_url("")).rstrip("/")
    sync = redis.Redis.from_url(settings.redis.url)
    try:
        served = await asyncio.to_thread(wait_served, sync, KEYS, base_url, 30.0, lambda: None)
        assert served.equal  # in step: returns at once
        assert served.served_version == 3

        await observer.set(KEYS.version, 1)
        await observer.publish(KEYS.versions_channel, 1)
        assert (await next_alert(observer))["rule"] == VERSION_REGRESSED
        ticks: list[int] = []
        served = await asyncio.to_thread(
            wait_served, sync, KEYS, base_url, 3.0, lambda: ticks.append(1)
        )
    finally:
        sync.close()
    assert (served.served_version, served.committed_version) == (3, 1)
    assert not served.equal
    assert len(ticks) > 1  # supervised every round, not only once
