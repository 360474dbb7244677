"""The services under their least-privilege Redis users (services/stores/acl.py),
and what each is refused.

A private redis-server loads the generated ACL file for the default prefix (as compose does). The
real aggregator, snapshot, control, evaluator and ingest services then each connect as their own
user, devices publish through ingest (signed) and straight to the stream as the worker user, and
training must work end to end with not one refusal in Redis's ACL log. The other tests connect as
each user and assert the NOPERM errors for what that user must not do.

A test-only `observer` user (all rights, appended to the generated file) only watches: it blocks
on streams instead of polling, and reads what an ACL cannot hide from it. No service uses it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    ResponseError,
)

from fedasync.client import DeviceClient
from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.commit import Batch, Committer
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main as cli
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.control.app import create_app as create_control_app
from fedasync.services.control.service import run as run_control
from fedasync.services.control.switchboard import set_switch
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.ingest.service import run as run_ingest
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import RedisSettings, Settings, load_settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores import evaluations
from fedasync.services.stores.device_keys import add_device, list_devices
from fedasync.services.stores.ledger import verify
from fedasync.services.stores.policy_store import OldPolicyLog, PolicyConflict, policy_log
from fedasync.services.worker.service import run as run_worker
from fedasync.shared import stream_entry
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.policy import Policy
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import (
    ACL_PREFIX,
    ACL_USERS,
    OBSERVER,
    acl_client,
    acl_url,
    ledger,
    next_entries,
    wait_for_ledger,
)
from tests.integration.test_migrate import write_old_policy_log

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]
T = TypeVar("T")

KEYS = Keys(ACL_PREFIX)
TOKEN = "acl-test-control-token-0123456789"
RUNS = 5  # updates each device publishes

# Redis 7.0 and 7.2+ word the refusals differently; each pattern accepts both wordings.
KEY_REFUSED = (
    r"this user has no permissions to access one of the keys used as arguments"
    r"|No permissions to access a key"
)
CHANNEL_REFUSED = (
    r"this user has no permissions to access one of the channels used as arguments"
    r"|No permissions to access a channel"
)


def command_refused(command: str) -> str:
    return rf"(this user|User \w+) has no permissions to run the '{re.escape(command)}' command"


def script_refused() -> str:
    """A command inside a script, refused: the caller's rights apply to what the script runs."""
    return (
        r"(The user executing the script can't (run this command or subcommand"
        r"|access at least one of the keys mentioned in the command arguments)"
        r"|ACL failure in script).*"
    )


# ------------------------------------------------------------------------------------ fixtures
@pytest_asyncio.fixture
async def clients(acl_server: RedisServer) -> AsyncIterator[dict[str, aioredis.Redis]]:
    """One client per generated user, the observer, and `health` (any password)."""
    out = {name: acl_client(acl_server, name) for name in [*ACL_USERS, OBSERVER]}
    out["health"] = connect(
        RedisSettings(url=f"redis://health:any@127.0.0.1:{acl_server.port}/0", socket_timeout_s=5.0)
    )
    try:
        yield out
    finally:
        for client in out.values():
            await client.aclose()


def settings_as(server: RedisServer, user: str, **sections: dict[str, Any]) -> Settings:
    base: dict[str, dict[str, Any]] = {
        "redis": {"url": acl_url(server, user), "key_prefix": ACL_PREFIX, "socket_timeout_s": 5.0},
        "task": {"name": "linear", "num_devices": 2},
        "aggregator": {"batch_ms": 20, "block_ms": 100, "port": 0},
        "budget": {"max_updates": 1000},
    }
    return load_settings(**(base | sections))


async def while_serving(services: list[asyncio.Task[Any]], awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, failing at once (with its error) if a service stops meanwhile."""
    main = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait([main, *services], timeout=120, return_when="FIRST_COMPLETED")
    if main in done:
        return main.result()
    main.cancel()
    for task in done:
        task.result()  # a service's error, e.g. a refusal
    raise AssertionError("a service stopped early" if done else "nothing happened in 120 s")


# --------------------------------------------------------------------------------- end to end
async def test_every_service_runs_as_its_own_user_and_training_works(
    acl_server: RedisServer, clients: dict[str, aioredis.Redis]
) -> None:
    admin, observer = clients["admin"], clients[OBSERVER]
    device_key = await add_device(admin, KEYS, "device-0")  # `fedasync devices add`, as admin
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    ports: dict[str, asyncio.Future[int]] = {
        n: loop.create_future() for n in ("snapshot", "control", "evaluator", "ingest")
    }
    aggregator = asyncio.create_task(
        run_aggregator(
            settings_as(acl_server, "aggregator"), handle_signals=False, stopping=stopping
        )
    )
    services = [
        run_snapshot(
            settings_as(acl_server, "snapshot", snapshot={"port": 0}),
            handle_signals=False,
            stopping=stopping,
            started=ports["snapshot"],
        ),
        run_control(
            settings_as(acl_server, "control", control={"port": 0, "token": TOKEN}),
            handle_signals=False,
            stopping=stopping,
            started=ports["control"],
        ),
        run_ingest(
            settings_as(acl_server, "ingest", ingest={"port": 0}),
            handle_signals=False,
            stopping=stopping,
            started=ports["ingest"],
        ),
    ]
    tasks = [aggregator, *(asyncio.create_task(s) for s in services)]
    snapshot_url = f"http://127.0.0.1:{await ports['snapshot']}"
    tasks.append(
        asyncio.create_task(
            run_evaluator(
                settings_as(
                    acl_server,
                    "evaluator",
                    evaluator={"port": 0, "snapshot_url": snapshot_url, "wait_s": 1.0},
                ),
                handle_signals=False,
                stopping=stopping,
                started=ports["evaluator"],
            )
        )
    )
    ingest_url = f"http://127.0.0.1:{await ports['ingest']}"
    worker = {"profile": "none", "snapshot_url": snapshot_url, "max_runs": RUNS}
    devices = [
        # a device on the internet: signed, over HTTP, no Redis credentials at all
        settings_as(
            acl_server,
            "worker",
            worker=worker
            | {"device_index": 0, "ingest_url": ingest_url, "key": SecretStr(device_key)},
        ),
        # a device on the trusted network: straight to the stream as the worker user
        settings_as(acl_server, "worker", worker=worker | {"device_index": 1}),
    ]
    try:
        results = await while_serving(
            tasks, asyncio.gather(*(run_worker(d, handle_signals=False) for d in devices))
        )
        await while_serving(tasks, wait_for_ledger(observer, KEYS, "0-0", 2 * RUNS))
        version = int(await observer.get(KEYS.version) or 0)
        # the evaluator scores the final version (it may skip intermediate ones)
        record = None
        after = "0-0"
        while record is None or record.version < version:
            entries = await while_serving(
                tasks, next_entries(observer, KEYS.evaluations, after, 20.0)
            )
            after = entries[-1][0].decode()
            record = evaluations.EvaluationRecord.from_json(entries[-1][1][b"e"])
        control_url = f"http://127.0.0.1:{await ports['control']}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{control_url}/v1/status", headers=auth) as response:
                assert response.status == 200
                status = await response.json()
            body = {"changes": {"alpha0": 0.5}, "why": "acl test"}
            async with session.patch(f"{control_url}/v1/policy", json=body, headers=auth) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["policy"]["alpha0"] == 0.5
        # each device reads a receipt: through ingest (signed), and as the worker user
        decided = await ledger(observer, KEYS)
        for device in (
            DeviceClient(snapshot_url, "device-0", key=device_key, ingest_url=ingest_url),
            DeviceClient(snapshot_url, "device-1", redis=acl_url(acl_server, "worker")),
        ):
            async with device:
                mine = next(d for d in decided if d["client_id"] == device.client_id)
                receipt = await while_serving(tasks, device.receipt(mine["update_id"]))
                assert receipt.ledger_id == mine["ledger_id"]
    finally:
        stopping.set()
        outcome, *_ = await asyncio.gather(*tasks)

    assert [r.published for r in results] == [RUNS, RUNS]
    assert [r.refused for r in results] == [0, 0]
    decisions = await ledger(admin, KEYS)  # `fedasync ledger export`, as admin
    assert Counter(d["client_id"] for d in decisions) == {"device-0": RUNS, "device-1": RUNS}
    applied = sum(d["outcome"] == "applied" for d in decisions)
    assert version == outcome.version == applied >= 1
    assert record.version == version
    assert status["version"] == version
    assert status["decisions"] == 2 * RUNS
    assert status["evaluation"] is not None
    report = await verify(admin, KEYS, 1 << 24)  # `fedasync ledger verify`, as admin
    assert report.ok, report.describe()
    assert await list_devices(admin, KEYS) == {"device-0": "active"}
    # not one command of any service was refused
    assert await admin.acl_log() == []


async def test_redis_refuses_to_start_on_the_unrendered_template(tmp_path: Path) -> None:
    """A `${REDIS_PASSWORD_<USER>}` token is no ACL rule: a template never runs with a known
    password (docker/redis/users.acl is loaded only once docker/redis/entrypoint.sh filled it)."""
    template = Path(__file__).resolve().parents[2] / "docker" / "redis" / "users.acl"
    server = RedisServer(tmp_path, extra_args=("--aclfile", str(template)))
    with pytest.raises(RuntimeError, match="redis-server exited"):
        server.start()
    assert "ACL" in (tmp_path / "redis.log").read_text()


# ------------------------------------------------------------------------------------ refusals
# (user, command, pattern of the refusal): each user can do none of these.
STATE, UPDATES, DEVICE_KEYS = KEYS.state, KEYS.updates, KEYS.device_keys
RECEIPTS, LEDGER = KEYS.receipts, KEYS.ledger

POLICIES, POLICY_LOG = KEYS.policies, KEYS.policy_log
REFUSALS: list[tuple[str, tuple[Any, ...], str]] = [
    # ingest: adds entries through its script; cannot trim, delete, read or overwrite
    ("ingest", ("XTRIM", UPDATES, "MAXLEN", "0"), command_refused("xtrim")),
    ("ingest", ("DEL", UPDATES), command_refused("del")),
    ("ingest", ("XRANGE", UPDATES, "-", "+"), KEY_REFUSED),  # XRANGE on the ledger only
    # ... reads receipts (HGET, then the ledger entry they name), never writes them
    ("ingest", ("HSET", RECEIPTS, "f", "1-1"), command_refused("hset")),
    ("ingest", ("HSETNX", RECEIPTS, "f", "1-1"), command_refused("hsetnx")),
    ("ingest", ("HGETALL", RECEIPTS), command_refused("hgetall")),
    ("ingest", ("DEL", RECEIPTS), command_refused("del")),
    ("ingest", ("XADD", LEDGER, "*", "d", "x"), KEY_REFUSED),
    ("ingest", ("HGET", STATE, "f"), KEY_REFUSED),
    ("ingest", ("SET", UPDATES, "x"), KEY_REFUSED),  # SET only on its markers
    ("ingest", ("GET", STATE), KEY_REFUSED),
    ("ingest", ("HSET", DEVICE_KEYS, "d", "k"), command_refused("hset")),
    ("ingest", ("HGETALL", DEVICE_KEYS), command_refused("hgetall")),
    # snapshot: reads models; writes nothing, not even a version announcement
    ("snapshot", ("SET", KEYS.version, "99"), command_refused("set")),
    ("snapshot", ("DEL", KEYS.model(0)), command_refused("del")),
    ("snapshot", ("XADD", UPDATES, "*", "m", "x"), KEY_REFUSED),  # XADD: to alerts only
    ("snapshot", ("XRANGE", KEYS.alerts, "-", "+"), command_refused("xrange")),
    ("snapshot", ("DEL", KEYS.alerts), command_refused("del")),
    ("snapshot", ("PUBLISH", KEYS.versions_channel, "99"), command_refused("publish")),
    ("snapshot", ("GET", STATE), KEY_REFUSED),
    # worker: appends to the stream; cannot trim, delete, read it, or touch the group
    ("worker", ("XTRIM", UPDATES, "MAXLEN", "0"), command_refused("xtrim")),
    ("worker", ("XDEL", UPDATES, "1-1"), command_refused("xdel")),
    ("worker", ("XGROUP", "DESTROY", UPDATES, AGGREGATOR_GROUP), command_refused("xgroup|destroy")),
    ("worker", ("XRANGE", UPDATES, "-", "+"), KEY_REFUSED),  # XRANGE on the ledger only
    ("worker", ("GET", STATE), command_refused("get")),
    ("worker", ("HMGET", DEVICE_KEYS, "d"), command_refused("hmget")),
    # ... reads receipts, never writes them nor the ledger
    ("worker", ("HSETNX", RECEIPTS, "f", "1-1"), command_refused("hsetnx")),
    ("worker", ("HDEL", RECEIPTS, "f"), command_refused("hdel")),
    ("worker", ("XADD", LEDGER, "*", "d", "x"), KEY_REFUSED),
    ("worker", ("HGET", DEVICE_KEYS, "d"), KEY_REFUSED),
    ("worker", ("LPOP", KEYS.receipts_order), command_refused("lpop")),
    # evaluator: its own stream only
    ("evaluator", ("XADD", UPDATES, "*", "m", "x"), KEY_REFUSED),
    ("evaluator", ("XREVRANGE", UPDATES, "+", "-"), KEY_REFUSED),
    ("evaluator", ("XLEN", UPDATES), command_refused("xlen")),
    ("evaluator", ("GET", STATE), command_refused("get")),
    # control: backlog figures of the stream, never its payloads; never state or keys
    ("control", ("XRANGE", UPDATES, "-", "+"), KEY_REFUSED),
    ("control", ("XTRIM", UPDATES, "MAXLEN", "0"), command_refused("xtrim")),
    ("control", ("SET", STATE, "x"), KEY_REFUSED),
    ("control", ("HGET", DEVICE_KEYS, "d"), KEY_REFUSED),
    # control: the policy history only grows; it cannot delete or rewrite a word of it
    ("control", ("DEL", POLICIES), command_refused("del")),
    ("control", ("DEL", POLICY_LOG), command_refused("del")),
    ("control", ("UNLINK", POLICY_LOG), command_refused("unlink")),
    ("control", ("RENAME", POLICY_LOG, "elsewhere"), command_refused("rename")),
    ("control", ("EXPIRE", POLICIES, "1"), command_refused("expire")),
    ("control", ("HSET", POLICIES, "0", "{}"), KEY_REFUSED),  # HSET only on the switches
    ("control", ("HDEL", POLICIES, "0"), KEY_REFUSED),
    ("control", ("SET", POLICIES, "x"), KEY_REFUSED),  # SET only on the policy in force
    ("control", ("SET", POLICY_LOG, "x"), KEY_REFUSED),
    ("control", ("XADD", POLICY_LOG, "MAXLEN", "0", "*", "a", "b"), KEY_REFUSED),
    ("control", ("LTRIM", POLICY_LOG, "1", "0"), command_refused("ltrim")),
    ("control", ("LSET", POLICY_LOG, "0", "x"), command_refused("lset")),
    ("control", ("LPOP", POLICY_LOG), command_refused("lpop")),
    ("control", ("LREM", POLICY_LOG, "0", "x"), command_refused("lrem")),
    ("control", ("EVAL", "return 1", "0"), command_refused("eval")),
    # control: reads the policy log back (LRANGE), no other list
    ("control", ("LRANGE", KEYS.receipts_order, "0", "-1"), KEY_REFUSED),
    ("control", ("LINDEX", POLICY_LOG, "0"), command_refused("lindex")),
    # admin: writes device keys but never reads one back; audits read-only
    ("admin", ("HGET", DEVICE_KEYS, "d"), KEY_REFUSED),
    ("admin", ("HMGET", DEVICE_KEYS, "d"), command_refused("hmget")),
    ("admin", ("SET", STATE, "x"), command_refused("set")),
    ("admin", ("XTRIM", UPDATES, "MAXLEN", "0"), command_refused("xtrim")),
    ("admin", ("HSET", RECEIPTS, "f", "1-1"), KEY_REFUSED),  # HSET on device keys only
    ("admin", ("LPOP", KEYS.receipts_order), command_refused("lpop")),
    # ... and rewrites the policy log (`fedasync migrate`), nothing else with those commands
    ("admin", ("DEL", STATE), KEY_REFUSED),
    ("admin", ("RPUSH", KEYS.receipts_order, "x"), KEY_REFUSED),
    ("admin", ("TYPE", STATE), KEY_REFUSED),
    ("admin", ("XRANGE", KEYS.alerts, "-", "+"), KEY_REFUSED),
    ("admin", ("LRANGE", POLICY_LOG, "0", "-1"), command_refused("lrange")),
    # aggregator: appends alerts, cannot delete or rewrite them
    ("aggregator", ("DEL", KEYS.alerts), KEY_REFUSED),
    ("aggregator", ("XTRIM", KEYS.alerts, "MAXLEN", "0"), KEY_REFUSED),
    ("aggregator", ("XREVRANGE", KEYS.alerts, "+", "-"), KEY_REFUSED),
    # aggregator: cannot read device keys in full (HGETALL only of the memory mode's hash), nor
    # change them
    ("aggregator", ("HGETALL", DEVICE_KEYS), KEY_REFUSED),
    ("aggregator", ("HSET", KEYS.memory + "x", "c", "d"), KEY_REFUSED),
    ("aggregator", ("HSET", DEVICE_KEYS, "d", "k"), KEY_REFUSED),
    # health (no password needed): PING only
    ("health", ("GET", STATE), command_refused("get")),
    ("health", ("XADD", UPDATES, "*", "m", "x"), command_refused("xadd")),
    ("health", ("FLUSHALL",), command_refused("flushall")),
    ("health", ("ACL", "SETUSER", "default", "on"), command_refused("acl|setuser")),
]


@pytest.mark.parametrize(
    ("user", "command", "refusal"),
    REFUSALS,
    ids=[f"{u}-{' '.join(str(a) for a in c[:2])}" for u, c, _ in REFUSALS],
)
async def test_user_is_refused(
    clients: dict[str, aioredis.Redis], user: str, command: tuple[Any, ...], refusal: str
) -> None:
    with pytest.raises(NoPermissionError) as refused:
        await clients[user].execute_command(*command)
    assert re.fullmatch(refusal, str(refused.value)), str(refused.value)


async def test_only_the_aggregator_can_run_the_commit_script(
    clients: dict[str, aioredis.Redis],
) -> None:
    def committer(user: str) -> Committer:
        return Committer(clients[user], KEYS, epoch=1, seq=0, keep_versions=2)

    for user in ("snapshot", "evaluator", "worker", "admin", "health"):
        with pytest.raises(NoPermissionError) as refused:
            await committer(user).commit(Batch(b"s", 0, b""), now=1.0)
        assert re.fullmatch(command_refused("evalsha"), str(refused.value)), user
    for user in ("control", "ingest"):  # they run scripts of their own, on their own keys
        with pytest.raises(NoPermissionError) as refused:
            await committer(user).commit(Batch(b"s", 0, b""), now=1.0)
        assert re.fullmatch(KEY_REFUSED, str(refused.value)), user
    await clients["aggregator"].incr(KEYS.epoch)  # what a starting aggregator does first
    await committer("aggregator").commit(Batch(b"s", 0, b""), now=1.0)
    assert await clients[OBSERVER].get(STATE) == b"s"


async def test_the_control_user_flips_a_switch_in_one_script(
    clients: dict[str, aioredis.Redis],
) -> None:
    """The flip script writes the policy records and the switches hash: the control user's rights
    cover every command it runs, and nobody else's do."""
    await clients[OBSERVER].set(KEYS.policy, json.dumps(Policy().to_dict(), sort_keys=True))
    on = await set_switch(clients["control"], KEYS, "raise-gamma", True, reason="r", who="ops")
    assert await clients[OBSERVER].hexists(KEYS.switches, "raise-gamma")
    off = await set_switch(clients["control"], KEYS, "raise-gamma", False, reason="r", who="ops")
    assert (on.version, off.version) == (1, 2)
    assert await clients[OBSERVER].hgetall(KEYS.switches) == {}
    assert await clients["admin"].acl_log() == []


async def test_the_control_user_cannot_rewrite_the_policy_history_through_a_script(
    clients: dict[str, aioredis.Redis],
) -> None:
    """Its scripts run with its rights: appending works, rewriting is refused command by command,
    and the history is exactly what the changes appended."""
    control, observer = clients["control"], clients[OBSERVER]
    await observer.set(KEYS.policy, json.dumps(Policy().to_dict(), sort_keys=True))
    await observer.hsetnx(POLICIES, "0", json.dumps(Policy().to_dict(), sort_keys=True))
    await set_switch(control, KEYS, "raise-gamma", True, reason="r", who="ops")
    await set_switch(control, KEYS, "raise-gamma", False, reason="r", who="ops")
    history = (await observer.hgetall(POLICIES), await observer.lrange(POLICY_LOG, 0, -1))
    assert sorted(history[0]) == [b"0", b"1", b"2"]
    assert [json.loads(e)["version"] for e in history[1]] == [1, 2]
    rewrites = [
        ("redis.call('HSET', KEYS[1], '1', 'forged')", [POLICIES]),
        ("redis.call('HDEL', KEYS[1], '1')", [POLICIES]),
        ("redis.call('DEL', KEYS[1])", [POLICY_LOG]),
        ("redis.call('LTRIM', KEYS[1], 1, 0)", [POLICY_LOG]),
        ("redis.call('LSET', KEYS[1], 0, 'forged')", [POLICY_LOG]),
        ("redis.call('SET', KEYS[1], 'forged')", [POLICY_LOG]),
    ]
    for body, keys in rewrites:
        script = control.register_script(f"return {body}")
        with pytest.raises(ResponseError) as refused:
            await script(keys=keys)
        assert re.fullmatch(script_refused(), str(refused.value)), (body, str(refused.value))
    assert (await observer.hgetall(POLICIES), await observer.lrange(POLICY_LOG, 0, -1)) == history
    # a version already in the history is never overwritten, not even through the change script
    await observer.hsetnx(POLICIES, "3", "planted")
    with pytest.raises(PolicyConflict, match="already in the history"):
        await set_switch(control, KEYS, "raise-gamma", True, reason="r", who="ops")
    assert await observer.hget(POLICIES, "3") == b"planted"
    assert await observer.lrange(POLICY_LOG, 0, -1) == history[1]


async def test_admin_migrates_an_old_policy_log_and_control_reads_it(
    acl_server: RedisServer,
    clients: dict[str, aioredis.Redis],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/operations.md, Upgrading: `fedasync migrate` as the admin user converts an earlier
    release's policy log (a stream) into the list; the aggregator refuses to start before and
    starts after; the control user reads the converted history. Not one refusal."""
    admin, observer = clients["admin"], clients[OBSERVER]
    expected = await write_old_policy_log(observer, KEYS)
    aggregator_settings = settings_as(acl_server, "aggregator")
    with pytest.raises(OldPolicyLog, match="fedasync migrate"):
        await run_aggregator(aggregator_settings, handle_signals=False, burst=True)

    monkeypatch.setenv("FEDASYNC_REDIS__URL", acl_url(acl_server, "admin"))
    monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", ACL_PREFIX)
    assert await asyncio.to_thread(cli, ["migrate"]) == 0
    assert "3 records converted from a stream to a list" in capsys.readouterr().out
    assert await observer.type(POLICY_LOG) == b"list"
    assert [json.loads(e) for e in await observer.lrange(POLICY_LOG, 0, -1)] == expected
    assert await asyncio.to_thread(cli, ["migrate"]) == 0  # nothing to do: WATCH, then UNWATCH
    assert "nothing to do" in capsys.readouterr().out

    await run_aggregator(aggregator_settings, handle_signals=False, burst=True)
    assert await policy_log(clients["control"], KEYS) == expected
    assert await policy_log(clients["control"], KEYS, last=1) == expected[-1:]
    assert await admin.acl_log() == []


async def test_the_control_user_serves_the_policy_history(
    acl_server: RedisServer, clients: dict[str, aioredis.Redis]
) -> None:
    """GET /v1/policy/history under the control user's rights: what PATCH /v1/policy appended
    (with who and why) is read back with LRANGE, and Redis refuses nothing."""
    await clients[OBSERVER].set(KEYS.policy, json.dumps(Policy().to_dict(), sort_keys=True))
    settings = settings_as(acl_server, "control", control={"token": TOKEN})
    app = create_control_app(settings, clients["control"], run_rules=False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(app)) as http:
        for alpha0, who in ((0.25, "alice"), (0.5, "bob")):
            changed = await http.patch(
                "/v1/policy",
                json={"changes": {"alpha0": alpha0}, "why": f"{who} tunes"},
                headers=auth | {"X-Fedasync-Operator": who},
            )
            assert changed.status == 200, await changed.text()
        response = await http.get("/v1/policy/history", headers=auth)
        assert response.status == 200, await response.text()
        history = await response.json()
        assert (await http.get("/v1/policy/history")).status == 401
    assert [(e["version"], e["who"], e["why"], e["policy"]["alpha0"]) for e in history] == [
        (2, "bob", "bob tunes", 0.5),
        (1, "alice", "alice tunes", 0.25),
    ]
    assert await clients["admin"].acl_log() == []


async def test_a_script_runs_with_its_callers_rights(clients: dict[str, aioredis.Redis]) -> None:
    # ingest may load and run scripts, and SET its markers: a script that SETs the state without
    # declaring it is still refused, command by command, inside the script
    script = clients["ingest"].register_script("return redis.call('SET', ARGV[1], 'x')")
    with pytest.raises(ResponseError) as refused:
        await script(keys=[], args=[STATE])
    assert re.fullmatch(script_refused(), str(refused.value)), str(refused.value)
    assert await clients[OBSERVER].exists(STATE) == 0


async def test_a_user_with_xadd_can_still_trim_through_maxlen(
    clients: dict[str, aioredis.Redis],
) -> None:
    """What an ACL cannot do: XADD is one command, MAXLEN one of its options. Whoever may append
    to the stream may trim it; that is why devices on the internet go through ingest."""
    worker, observer = clients["worker"], clients[OBSERVER]
    for _ in range(3):
        await worker.xadd(UPDATES, stream_entry.build(b"x"))
    await worker.xadd(UPDATES, stream_entry.build(b"x"), maxlen=1, approximate=False)
    assert await observer.xlen(UPDATES) == 1


async def test_only_the_aggregator_publishes_and_only_the_snapshot_listens(
    clients: dict[str, aioredis.Redis],
) -> None:
    channel = KEYS.versions_channel
    for user in ("worker", "evaluator", "control", "ingest", "admin"):
        with pytest.raises(NoPermissionError) as refused:
            await clients[user].execute_command("SUBSCRIBE", channel)
        assert re.fullmatch(command_refused("subscribe"), str(refused.value)), user
    with pytest.raises(NoPermissionError) as refused:
        await clients["snapshot"].execute_command("SUBSCRIBE", f"{channel}-other")
    assert re.fullmatch(CHANNEL_REFUSED, str(refused.value)), str(refused.value)
    with pytest.raises(NoPermissionError) as refused:
        await clients["aggregator"].publish(f"{channel}-other", b"1")
    assert re.fullmatch(CHANNEL_REFUSED, str(refused.value)), str(refused.value)
    assert await clients["aggregator"].publish(channel, b"1") == 0  # allowed; nobody listens


# ------------------------------------------------------------------- restart under the ACL file
async def snapshot_of_every_key(observer: aioredis.Redis) -> dict[bytes, Any]:
    """Every key's type and content, read as the observer: what a restart must give back."""
    out: dict[bytes, Any] = {}
    for key in sorted(await observer.keys("*")):
        kind = (await observer.type(key)).decode()
        if kind == "string":
            out[key] = await observer.get(key)
        elif kind == "hash":
            out[key] = await observer.hgetall(key)
        elif kind == "zset":
            out[key] = await observer.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            out[key] = await observer.lrange(key, 0, -1)
        elif kind == "stream":
            groups = await observer.xinfo_groups(key)
            out[key] = (
                await observer.xrange(key),
                [(g["name"], g["last-delivered-id"], g["pending"]) for g in groups],
            )
        else:
            raise AssertionError(f"{key!r}: a key of type {kind} this test does not compare")
    return out


async def publish_updates(worker: aioredis.Redis, first: int, count: int, base: int) -> None:
    size = get_task("linear").layout.size
    rng = np.random.default_rng(first)
    for i in range(first, first + count):
        weights = rng.standard_normal(size).astype(np.float32)
        update = Update(f"u{i}", f"device-{i % 3}", base, 10, weights)
        await worker.xadd(UPDATES, stream_entry.build(encode_update(update)))


async def test_a_redis_kill_9_under_the_acl_file_keeps_every_commit(
    acl_server: RedisServer,
) -> None:
    """Issue 12, item 0: Redis 7.0 replays its AOF as the default user and re-checks that user's
    ACL at each EXEC; a restricted default user made it skip every MULTI/EXEC block, i.e. every
    commit. After a kill -9 and a restart, state, model, ledger and consumer group must be intact,
    and the aggregator must carry on from the version it had reached."""
    aggregator_settings = settings_as(acl_server, "aggregator")
    observer = acl_client(acl_server, OBSERVER)
    worker = acl_client(acl_server, "worker")
    control = acl_client(acl_server, "control")
    try:
        await publish_updates(worker, 0, 12, base=0)
        await run_aggregator(aggregator_settings, handle_signals=False, burst=True)
        # the control service's scripts write several keys too: a switch flip is one of them
        await set_switch(control, KEYS, "raise-gamma", True, reason="before the kill", who="t")
        before = await snapshot_of_every_key(observer)
        version_before = int(before[KEYS.version.encode()])
        assert version_before >= 1
        # the fault is the one that bit: commits are in the AOF as MULTI/EXEC blocks
        aof = b"".join(p.read_bytes() for p in acl_server.directory.rglob("*.aof"))
        commits = int(before[KEYS.commit_seq.encode()])
        assert aof.count(b"MULTI") >= commits >= 1, "the commits were not logged as MULTI/EXEC"
        pid = acl_server.process.pid if acl_server.process else None
        await observer.aclose()
        await worker.aclose()
        await control.aclose()

        acl_server.restart()  # SIGKILL, then the same port, data directory and ACL file

        assert acl_server.process is not None
        assert acl_server.process.pid != pid
        log = (acl_server.directory / "redis.log").read_text()
        assert "NOPERM" not in log, "the AOF replay refused a transaction"
        observer = acl_client(acl_server, OBSERVER)
        worker = acl_client(acl_server, "worker")
        control = acl_client(acl_server, "control")
        assert await snapshot_of_every_key(observer) == before
        # and the aggregator resumes where it was, not from genesis
        await publish_updates(worker, 12, 6, base=version_before)
        await run_aggregator(aggregator_settings, handle_signals=False, burst=True)
        decisions = await ledger(observer, KEYS)
        assert [d["update_id"] for d in decisions] == [f"u{i}" for i in range(18)]
        applied = [d["version"] for d in decisions if d["outcome"] == "applied"]
        assert applied == list(range(1, len(applied) + 1))
        assert applied[-1] > version_before
        report = await verify(observer, KEYS, 1 << 24)
        assert report.ok, report.describe()
    finally:
        for client in (observer, worker, control):
            await client.aclose()


async def test_nobody_can_log_in_as_the_default_user(acl_server: RedisServer) -> None:
    """Off, the default user takes no client: a connection without credentials gets NOAUTH and
    AUTH as `default` is refused, whatever password; health checks log in as `health`."""
    anonymous = connect(RedisSettings(url=acl_server.url, socket_timeout_s=5.0))
    as_default = connect(
        RedisSettings(url=f"redis://default:x@127.0.0.1:{acl_server.port}/0", socket_timeout_s=5.0)
    )
    health = connect(
        RedisSettings(url=f"redis://health:any@127.0.0.1:{acl_server.port}/0", socket_timeout_s=5.0)
    )
    try:
        with pytest.raises(AuthenticationError):
            await anonymous.get(STATE)
        with pytest.raises((AuthenticationError, AuthenticationWrongNumberOfArgsError)):
            await as_default.ping()
        assert await health.ping() is True
        with pytest.raises(NoPermissionError):
            await health.get(STATE)
    finally:
        for client in (anonymous, as_default, health):
            await client.aclose()
