"""One stalled Redis command, anywhere on the aggregator's path, is survived.

A fault proxy (services/commands/chaos/proxy.py) sits between the aggregator and a private Redis.
A normal run through it records every command the aggregator sends, named by command and key
(`START` while it starts for the first time, `LOOP` while it runs, `RESTART` while it starts
again and takes over an abandoned entry); the lists are checked here, so a new command on the
aggregator's path cannot go untested. Then each command in turn is stalled once for longer than
the socket timeout:

- `reply`: Redis runs it, the reply is held back until the client gave up (a lost reply), for
  every command in every phase;
- `request`: it reaches Redis only after the client gave up and went on (a late command), for
  every command of the loop and every write of the start.

Each time the test first proves the stall happened, then that the aggregator stayed up and
decided everything: every update exactly once, nothing left pending, `ledger verify` OK.
A late start-up INCR of the epoch is the one exception: it fences off the aggregator that sent
it, which stops (exit code 3) without losing anything; that case has a test of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Fenced
from fedasync.services.aggregator.service import Aggregator
from fedasync.services.commands.chaos.proxy import Command, RedisProxy, Stall, StallMode
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.device_keys import add_device
from fedasync.services.stores.ledger import records, verify
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import parse_key, sign
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PREFIX = "stall"
KEYS = Keys(PREFIX)
SOCKET_TIMEOUT_S = 0.5
#: longer than the socket timeout: the aggregator's client gives up on the stalled command
STALL_S = 1.5
#: generous; every wait is for an event
DEADLINE_S = 60.0
#: updates published at most while waiting for a stall to happen
MAX_UPDATES = 400
DEVICE = "dev-0"

#: what the aggregator sends while it starts for the first time (command, key without the
#: prefix); PING is redis-py's health check on each new connection
START = (
    "EVALSHA commit-seq",
    # the lag correction (stores/backlog.py), with the gauges
    "EVALSHA updates",
    "EXISTS started-at",
    "EXISTS updates",
    "GET commit-seq",
    "GET policy",
    "GET started-at",
    "GET state",
    "GET version",
    "HGET run",
    "HGETALL memory",
    "HSET run",
    "HSETNX policies",
    "HSETNX run",
    # the run listed in the directory of runs at every start (stores/runs.register)
    "HSETNX {fedasync:runs}:index",
    "INCRBY aggregator-epoch",
    "PING",
    "SCRIPT LOAD",
    # the run's noise secret, made (SET NX) at the first start (stores/dp_secret.py)
    "SET dp-secret",
    "SET genesis",
    "SET policy",
    "SET started-at",
    "TYPE policy-log",
    "XGROUP CREATE updates",
    "XINFO GROUPS updates",
    "XLEN ledger",
    "XLEN updates",
    "XPENDING updates",
    "XREVRANGE ledger",
)
#: the writes among them: a late one (after its retry) must change nothing
START_WRITES = tuple(
    n for n in START if n.split()[0] in ("SET", "HSET", "HSETNX", "XGROUP", "EVALSHA")
)
#: what it sends while it runs: reads, device keys, policy, claims, commits, gauges
LOOP = (
    "EVALSHA commit-seq",
    "EVALSHA updates",
    "EXISTS updates",
    "GET aggregator-epoch",
    "GET policy",
    "HMGET device-keys",
    "HMGET device-revoked",
    "PING",
    "XCLAIM updates",
    "XINFO GROUPS updates",
    "XLEN updates",
    "XPENDING updates",
    "XREADGROUP updates",
)
#: what it sends when it starts again, restoring the last commit and taking over an entry
RESTART = (
    # the version restored is announced again (services/aggregator/service.py)
    "EVALSHA announced",
    "EXISTS started-at",
    "GET commit-seq",
    # ... and read at every later one, once its SET NX found it there
    "GET dp-secret",
    "GET model:*",
    "GET policy",
    "GET started-at",
    "GET state",
    "GET version",
    "HGET run",
    "HGETALL memory",
    "HSET run",
    "HSETNX policies",
    "HSETNX run",
    # the run listed in the directory of runs at every start (stores/runs.register)
    "HSETNX {fedasync:runs}:index",
    "INCRBY aggregator-epoch",
    "PING",
    "SCRIPT LOAD",
    "SET dp-secret",
    "SET policy",
    "SET started-at",
    "TYPE policy-log",
    "XCLAIM updates",
    "XGROUP CREATE updates",
    "XINFO GROUPS updates",
    "XLEN ledger",
    "XPENDING updates",
    "XREVRANGE ledger",
    "ZRANGEBYSCORE dedup",
)


def signature(command: Command) -> str:
    """A command as the lists above name it: the key without its prefix, versions as `*`."""
    if command.key is None:
        return command.name
    role = command.key.removeprefix(f"{{{PREFIX}}}:")
    if role.startswith("model:"):
        role = "model:*"
    return f"{command.name} {role}"


def stalls(phase: str, names: tuple[str, ...], modes: tuple[StallMode, ...]) -> list[Any]:
    return [
        pytest.param(phase, name, mode, id=f"{phase}-{mode.value}-{name.replace(' ', '-')}")
        for name in names
        for mode in modes
    ]


@dataclass
class System:
    """A private Redis, the proxy in front of it, and a client of each."""

    server: RedisServer
    proxy: RedisProxy
    settings: Settings
    direct: aioredis.Redis
    key: bytes = b""
    published: list[str] = field(default_factory=list)

    def aggregator(self) -> tuple[Aggregator, aioredis.Redis]:
        client = connect(self.settings.redis)
        return Aggregator(self.settings, client, KEYS), client

    async def publish_signed(self, update_id: str) -> None:
        version = int(await self.direct.get(KEYS.version) or 0)
        raw = encode_update(make_update(update_id, base=version, client=DEVICE))
        proof = sign(self.key, DEVICE, int(time.time() * 1000), raw)
        await self.direct.xadd(KEYS.updates, stream_entry.build(raw, proof))  # type: ignore[arg-type]
        self.published.append(update_id)

    async def abandoned_entry(self, update_id: str) -> None:
        """An entry read by a consumer that then went away: claimed by the aggregator."""
        await publish(self.direct, KEYS, make_update(update_id, base=0))
        await self.direct.xreadgroup(AGGREGATOR_GROUP, "gone", {KEYS.updates: ">"}, count=1)
        self.published.append(update_id)

    async def decided(self) -> Counter[str]:
        return Counter([r["update_id"] async for r in records(self.direct, KEYS)])

    async def wait_decided(self, update_id: str) -> None:
        """Block on the ledger stream (no polling) until `update_id` has a decision."""
        cursor = "0-0"
        while True:
            async for record in records(self.direct, KEYS, after=cursor):
                cursor = record["ledger_id"]
                if record["update_id"] == update_id:
                    return
            reply: Any = await self.direct.xread({KEYS.ledger: cursor}, block=30_000, count=1)
            if not reply:
                raise TimeoutError(f"{update_id} not decided within 30 s")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: its script cache is empty, so SCRIPT LOAD is sent too."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    try:
        yield redis_server
    finally:
        redis_server.stop()


@pytest_asyncio.fixture
async def system(server: RedisServer) -> AsyncIterator[System]:
    proxy = RedisProxy("127.0.0.1", server.port, record=True)
    await proxy.start()
    settings = load_settings(
        redis={"url": proxy.url, "key_prefix": PREFIX, "socket_timeout_s": SOCKET_TIMEOUT_S},
        task={"name": "linear"},
        aggregator={
            "batch_ms": 20,
            "block_ms": 100,
            "claim_interval_s": 0.2,
            "claim_idle_s": 0.3,
        },
    )
    direct = aioredis.Redis(port=server.port, protocol=2, socket_timeout=DEADLINE_S)
    try:
        built = System(server, proxy, settings, direct)
        built.key = parse_key(await add_device(direct, KEYS, DEVICE))
        # as after an earlier run: the group exists, so an entry can be abandoned before start
        await direct.xgroup_create(KEYS.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
        yield built
    finally:
        await direct.aclose()
        await proxy.aclose()


async def exercise(system: System, phase: str | None, target: str, mode: StallMode) -> Stall | None:
    """Start an aggregator through the proxy, keep updates coming (each after the previous
    one's decision), stop it; then restart it with an entry a consumer abandoned meanwhile, and
    let it drain. `target` is stalled once in `phase` (start, loop, restart; None: no stall);
    updates keep coming until the stall has happened and a few more were decided."""
    stall = None
    seen = system.proxy.seen

    def arm() -> Stall:
        return system.proxy.stall(lambda c: signature(c) == target, STALL_S, mode)

    aggregator, client = system.aggregator()
    stopping = asyncio.Event()
    try:
        if phase == "start":
            stall = arm()
        await aggregator.start(initial_state(system.settings))
        seen.append(STARTED)
        if phase == "loop":
            stall = arm()
        running = asyncio.create_task(aggregator.run(stopping))
        await system.abandoned_entry("gone-while-running")
        after = 0
        for i in range(MAX_UPDATES):
            await system.publish_signed(f"u{i}")
            await asyncio.wait_for(system.wait_decided(f"u{i}"), DEADLINE_S)
            if (stall is None or phase == "restart") and phases(seen)[1] >= set(LOOP):
                break
            if stall is not None and stall.fired.is_set():
                after += 1
                if after >= 3:
                    break
        await system.wait_decided("gone-while-running")
        stopping.set()
        await asyncio.wait_for(running, DEADLINE_S)  # the aggregator stayed up: no exception
    finally:
        stopping.set()
        await client.aclose()
    seen.append(STOPPED)
    await system.abandoned_entry("gone-before-restart")
    aggregator, client = system.aggregator()
    try:
        if phase == "restart":
            stall = arm()
        await aggregator.start(None)
        seen.append(RESTARTED)
        await asyncio.wait_for(aggregator.run(asyncio.Event(), burst=True), DEADLINE_S)
    finally:
        await client.aclose()
    return stall


STARTED, STOPPED, RESTARTED = Command("-- started --"), Command("-- stopped --"), Command("--")


def phases(seen: list[Command]) -> tuple[set[str], set[str], set[str]]:
    """What was sent while starting, while running, while restarting."""
    marks = [seen.index(m) if m in seen else len(seen) for m in (STARTED, STOPPED, RESTARTED)]
    start = seen[: marks[0]]
    loop = seen[marks[0] + 1 : marks[1]]
    restart = seen[marks[1] + 1 : marks[2]]
    return tuple({signature(c) for c in part} for part in (start, loop, restart))  # type: ignore[return-value]


async def check_everything_decided_once(system: System) -> None:
    decided = await system.decided()
    assert sorted(decided) == sorted(system.published)
    assert set(decided.values()) == {1}, decided
    pending: Any = await system.direct.xpending(KEYS.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    report = await verify(system.direct, KEYS, system.settings.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_every_command_the_aggregator_sends_is_listed(system: System) -> None:
    await exercise(system, None, "", StallMode.REPLY)
    start, loop, restart = phases(system.proxy.seen)
    assert sorted(start) == list(START)
    assert sorted(loop) == list(LOOP)
    assert sorted(restart) == list(RESTART)
    await check_everything_decided_once(system)


@pytest.mark.parametrize(
    ("phase", "target", "mode"),
    stalls("start", START, (StallMode.REPLY,))
    + stalls("start", START_WRITES, (StallMode.REQUEST,))
    + stalls("loop", LOOP, (StallMode.REPLY, StallMode.REQUEST))
    + stalls("restart", RESTART, (StallMode.REPLY,)),
)
async def test_one_stalled_command_is_survived(
    system: System, phase: str, target: str, mode: StallMode
) -> None:
    stall = await exercise(system, phase, target, mode)
    assert stall is not None
    assert stall.fired.is_set(), f"{target} was never sent: the stall did not happen"
    assert [signature(c) for c in stall.hits] == [target]
    await check_everything_decided_once(system)


async def test_a_late_epoch_increment_fences_off_its_sender_and_loses_nothing(
    system: System,
) -> None:
    """An INCR that reaches Redis after the client retried it raises the epoch twice: the
    aggregator finds itself fenced off at its next claim and stops; restarted, it decides all."""
    stall = system.proxy.stall(
        lambda c: signature(c) == "INCRBY aggregator-epoch", STALL_S, StallMode.REQUEST
    )
    aggregator, client = system.aggregator()
    try:
        await aggregator.start(initial_state(system.settings))
        await system.publish_signed("u0")
        await asyncio.wait_for(stall.fired.wait(), DEADLINE_S)
        with pytest.raises(Fenced):
            await asyncio.wait_for(aggregator.run(asyncio.Event()), DEADLINE_S)
    finally:
        await client.aclose()
    restarted, client = system.aggregator()
    try:
        await restarted.start(None)
        await restarted.run(asyncio.Event(), burst=True)
    finally:
        await client.aclose()
    await check_everything_decided_once(system)
