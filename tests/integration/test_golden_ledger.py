"""Golden ledgers: the real aggregator, fixed updates, and everything it recorded, byte for byte.

Each scenario writes a fixed sequence of updates (contents drawn from a seeded generator, fixed
update ids, client ids and base versions) to the updates stream the way a device does (one XADD
of `stream_entry.build(encode_update(...))`), runs the real aggregator service
(`services.aggregator.service.run`, in this process) against a private redis-server until it has
decided them, and then reads back what the aggregator recorded: every ledger record, every dead
letter, every committed model version, the committed checkpoint, the memory, dedup and receipts
it keeps, the policies in force. That is serialised canonically (one JSON object a line, keys
sorted) and compared byte for byte with tests/golden/<scenario>.jsonl, written on the code as it
was before the refactor of issue 26. A refactor that changes one decision, one weight's bit or one
field the commit writes fails here with a diff.

Decisions must not depend on timing, so the order the aggregator reads the entries and the
policy it decides them with are fixed:
- a phase's entries are written before its aggregator starts (the first phase, and every phase
  that restarts it), or, while it runs, only after it has taken in the phase's policy change:
  the change is written, then MONITOR (on our own redis-server) shows the aggregator's next
  `GET` of the policy key, which can only return the new policy; entries written after that
  are decided under it (the refresh happens between batches, before any read). Should the
  aggregator ever stop reading the policy by a GET of its key, that wait times out: the test
  fails, it never passes on a policy not yet taken in;
- the next phase begins only once the ledger holds the decision of the phase's last entry
  (a blocking XREAD, no polling): entries are decided in stream order, so all of it is decided;
- one entry per commit (`batch_max = 1`), so the commit sequence and the models kept (one per
  version) do not depend on how reads happen to be grouped into batches.

Stripped, because they are wall-clock or run dependent (nothing else is):
- `at` of ledger records, dead letters and `{p}:done` (time.time() of the decision / commit);
- `ledger_id` (the ledger's entry id: a millisecond timestamp) and every updates-stream entry id
  (`stream_id` of records and dead letters): replaced by the entry's position in the updates
  stream (`entry`, 0-based); receipts name their decision by its position in the ledger;
- `created_at` of committed model messages (time.time() of the commit);
- `{p}:started-at`, the policy log's `at`, the aggregator epoch, the key prefix: not recorded.
Byte strings (weights, checkpoint arrays, payloads) are recorded as their SHA-256 and length.

Regenerate (only on code whose behaviour is the reference, then review `git diff tests/golden`):

    GOLDEN_REGEN=1 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/integration/test_golden_ledger.py

writes every tests/golden/<scenario>.jsonl and skips each test saying so; without it the tests
compare. (Not a FEDASYNC_ variable: the settings refuse any FEDASYNC_ name they do not know.)
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import os
import time
import zlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.ledger import records, verify
from fedasync.services.stores.policy_store import change_policy, read_policy
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import SIZE, initial_state, next_entries, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
#: set to 1 to write the golden files instead of comparing with them
REGEN = os.environ.get("GOLDEN_REGEN") == "1"
#: longest wait for one event (a phase decided, the policy taken in, an aggregator stopped)
DEADLINE_S = 60.0

T = TypeVar("T")


# --------------------------------------------------------------------------------- scenarios
@dataclass(frozen=True)
class Send:
    """One update, as a device publishes it. Its weights are drawn from a generator seeded with
    the scenario's seed and the update id: `center + scale·N(0, 1)`, `size` of them."""

    update_id: str
    client: str
    base: int
    samples: int = 10
    scale: float = 0.5
    center: float = 0.0
    dtype: str = "float32"
    size: int = SIZE


@dataclass(frozen=True)
class Resend:
    """The exact bytes of an earlier `Send` published again: a device retry (a duplicate)."""

    update_id: str


@dataclass(frozen=True)
class Raw:
    """Bytes that are no update (dead-lettered before the core sees them)."""

    payload: bytes


Entry = Send | Resend | Raw


@dataclass(frozen=True)
class Phase:
    """Entries written together. `change`: policy fields changed first (through the policy
    store, as the control service does); `restart`: the aggregator is stopped before the change
    and a new one started once the entries are written (it restores the last commit)."""

    entries: tuple[Entry, ...]
    change: Mapping[str, Any] | None = None
    restart: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    #: the configured policy (FEDASYNC_POLICY__*), its mode's preset under it
    policy: Mapping[str, Any]
    phases: tuple[Phase, ...]
    seed: int = 26


def sends(prefix: str, plan: str, *more: Entry) -> tuple[Entry, ...]:
    """Updates `prefix0`, `prefix1`, … from a plan of `client@base` words, then `more`."""
    pairs = [word.split("@") for word in plan.split()]
    return (*(Send(f"{prefix}{i}", c, int(b)) for i, (c, b) in enumerate(pairs)), *more)


SCENARIOS = (
    Scenario(
        "fedasync",
        {"mode": "fedasync", "tau_max": 4},
        (
            Phase(
                (
                    Send("a0", "c0", 0),
                    Send("a1", "c1", 0, samples=30),
                    Send("a2", "c2", 1, scale=0.3),
                    Send("a3", "c3", 2, dtype="float16"),
                    Resend("a1"),  # duplicate, in the same read as the original
                    Send("a4", "c0", 4),
                    Raw(b"\xc1not msgpack"),  # dead letter, no decision
                    Send("a5", "c1", 0),  # τ = 5 > 4: stale
                    Send("a6", "c2", 5, size=3),  # rejected: shape_mismatch
                    Send("a7", "c3", 99),  # rejected: future_base_version
                    Send("a8", "c0", 5),
                    Send("a9", "c1", 6, center=1.0),
                )
            ),
            Phase(
                (
                    Send("b0", "c2", 7),
                    Resend("a8"),  # duplicate of an update committed a phase ago
                    Send("b1", "c3", 5),
                    Send("b2", "c0", 8, samples=5),
                ),
                change={"alpha0": 0.3, "decay": "exponential", "lam": 0.8},
            ),
            Phase(  # a budget set at runtime: 12 applied updates, then every update is dropped
                (Send("c0", "c1", 9), Send("c1", "c2", 10), Send("c2", "c3", 10)),
                change={"max_updates": 12},
            ),
        ),
    ),
    Scenario(
        "fedbuff",
        {"mode": "fedbuff", "buffer_size": 3, "tau_max": 2},
        (
            Phase(
                sends(
                    "f",
                    "c0@0 c1@0 c2@0 c3@0 c4@1 c0@1 c1@0 c2@2 c3@2 c4@1 c0@3 c1@3",
                    Resend("f4"),  # duplicate
                    Send("fz", "c2", 0),  # τ = 4 > 2: stale
                )
            ),
            Phase(  # τ_max raised at runtime: a base the history no longer holds
                (Send("g0", "c3", 1), Send("g1", "c4", 4), Send("g2", "c0", 4)),
                change={"tau_max": 6},
            ),
        ),
    ),
    Scenario(
        "memory",
        {
            "mode": "memory",
            "buffer_size": 3,
            "memory_clients": 3,
            "memory_idle": 3,
            "server_optimizer": "momentum",
            "server_lr": 0.8,
        },
        (
            Phase(
                sends(
                    "m", "c0@0 c1@0 c2@0 c0@1 c3@1 c1@1 c3@2 c3@2 c0@2 c2@1 c1@3 c3@3", Resend("m5")
                )
            ),
        ),
    ),
    Scenario(
        "tiered",
        {"mode": "tiered", "tiers": 2, "buffer_size": 2, "tau_max": 6, "server_lr": 0.7},
        (
            Phase(
                sends(
                    "t",
                    "c0@0 c1@0 c2@0 c3@0 c0@0 c1@1 c0@1 c2@0 c1@2 c3@0 c0@2 c1@3"
                    " c2@1 c0@3 c3@1 c1@4",
                    Resend("t3"),  # duplicate
                    Send("tz", "c2", 0),  # τ = 8 > 6: stale
                )
            ),
        ),
    ),
    Scenario(
        "fedbuff-fair",
        {"mode": "fedbuff-fair", "buffer_size": 3, "memory_clients": 3},
        (
            Phase(
                # r6: c1's first after six of c0's, weight 7 / (2·1) capped at K = 3
                sends(
                    "r",
                    "c0@0 c0@0 c0@0 c0@1 c0@1 c0@1 c1@2 c0@2 c2@2 c3@3 c0@3 c2@3 c1@3 c3@4",
                    Resend("r2"),
                )
            ),
        ),
    ),
    Scenario(
        "norm-fedasync",  # reject, then clip from a change at runtime
        {"mode": "fedasync", "tau_max": 20, "norm_bound": 2.0, "norm_window": 5},
        (
            Phase(
                sends(
                    "n",
                    "c0@0 c1@1 c2@2 c3@3 c0@4 c1@5",
                    Send("nx", "c9", 6, scale=20.0),
                    Send("n6", "c2", 6),
                    Send("n7", "c3", 7),
                )
            ),
            Phase(
                (Send("ny", "c9", 8, scale=20.0), Send("o0", "c0", 9), Send("o1", "c1", 9)),
                change={"norm_action": "clip"},
            ),
        ),
    ),
    Scenario(
        "norm-fedbuff-adam",  # clip, then reject from a change at runtime; Adam server steps
        {
            "mode": "fedbuff",
            "buffer_size": 2,
            "tau_max": 4,
            "norm_bound": 1.5,
            "norm_window": 5,
            "norm_action": "clip",
            "server_optimizer": "adam",
            "server_lr": 0.1,
        },
        (
            Phase(
                sends(
                    "n",
                    "c0@0 c1@0 c2@1 c3@1 c0@2 c1@2",
                    Send("nx", "c9", 3, scale=10.0),
                    Send("n6", "c2", 3),
                    Send("n7", "c3", 3),
                )
            ),
            Phase(
                (Send("ny", "c9", 4, scale=10.0), Send("o0", "c0", 4), Send("o1", "c1", 5)),
                change={"norm_action": "reject"},
            ),
        ),
    ),
    Scenario(
        "norm-tiered",  # the tiered mode's own bound: reject, then clip
        {"mode": "tiered", "tiers": 2, "buffer_size": 2, "norm_bound": 2.0, "norm_window": 5},
        (
            Phase(
                sends(
                    "n",
                    "c0@0 c1@0 c2@0 c3@0 c0@1 c1@1",
                    Send("nx", "c2", 1, scale=20.0),
                    Send("n6", "c2", 2),
                )
            ),
            Phase(
                (Send("ny", "c3", 2, scale=20.0), Send("o0", "c0", 3), Send("o1", "c1", 3)),
                change={"norm_action": "clip"},
            ),
        ),
    ),
    Scenario(
        "switch-live",  # the mode changed while the aggregator runs, with state still held
        {"mode": "fedbuff", "buffer_size": 4, "tau_max": 8},
        (
            Phase(sends("p", "c0@0 c1@0 c2@0 c3@0 c0@1 c1@1")),
            Phase(  # two updates still buffered: stepped by the first FedAsync update
                sends("q", "c2@1 c3@2 c0@3"), change={"mode": "fedasync"}
            ),
            Phase(
                sends("r", "c1@4 c2@4 c3@4 c0@5 c1@5"),
                change={"mode": "memory", "buffer_size": 3},
            ),
            Phase(  # two remembered since the memory's last step: stepped, the memory emptied
                sends("s", "c2@5 c3@6 c0@6 c1@6"),
                change={"mode": "fedbuff"},
            ),
            Phase(  # one buffered: stepped by the first tiered update
                sends("t", "c2@7 c3@7 c0@7 c1@7 c2@8"),
                change={"mode": "tiered", "tiers": 2, "buffer_size": 2},
            ),
            Phase(  # the tiered mode kept no models: u0's base is gone; u1 finds a partial tier
                # round, completed, the tiers averaged, then emptied; u3 is left buffered
                sends("u", "c3@8 c0@10 c1@10 c2@11"),
                change={"mode": "fedbuff-fair", "buffer_size": 2},
            ),
            Phase(sends("v", "c3@12 c0@13"), change={"mode": "fedasync"}),
        ),
    ),
    Scenario(
        "switch-restart",  # the same across restarts: the state held comes from the checkpoint
        {"mode": "fedbuff-fair", "buffer_size": 3, "tau_max": 8},
        (
            Phase(sends("p", "c0@0 c1@0 c0@0 c2@0")),
            Phase(
                sends("q", "c1@1 c2@1 c0@1 c3@1 c1@1"),
                change={"mode": "tiered", "tiers": 2},
                restart=True,
            ),
            Phase(
                # r0: the tiered mode kept no history of models, so base 2 is gone
                sends("r", "c2@2 c3@3 c0@3 c1@3"),
                change={"mode": "memory", "buffer_size": 2},
                restart=True,
            ),
            Phase(
                sends("s", "c1@4 c2@4", Resend("r1")),
                change={"mode": "fedasync"},
                restart=True,
            ),
            Phase(sends("t", "c3@5 c0@6"), restart=True),
        ),
    ),
)


# --------------------------------------------------------------------------------- fixtures
def settings_for(server: RedisServer, scenario: Scenario) -> Settings:
    return load_settings(
        redis={"url": server.url, "key_prefix": f"golden-{scenario.name}", "socket_timeout_s": 5},
        task={"name": "linear"},
        policy=dict(scenario.policy),
        # one entry a commit: the commits and the models kept do not depend on read timing;
        # no HTTP side; every version kept; nothing taken over from a slow start
        aggregator={
            "batch_max": 1,
            "batch_ms": 20,
            "block_ms": 100,
            "port": None,
            "keep_versions": 1000,
            "claim_idle_s": 600.0,
        },
    )


# --------------------------------------------------------------------------------- driving
def build_update(scenario: Scenario, send: Send) -> bytes:
    rng = np.random.default_rng([scenario.seed, zlib.crc32(send.update_id.encode())])
    weights = (send.center + send.scale * rng.standard_normal(send.size)).astype(np.float32)
    update = Update(
        send.update_id,
        send.client,
        send.base,
        send.samples,
        weights,
        created_at=1.0,
        metrics={"loss": 0.5},
    )
    return encode_update(update, send.dtype)


class Aggregator:
    """The real aggregator service, running in this process until stopped."""

    def __init__(self, settings: Settings) -> None:
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(
            run_aggregator(
                settings,
                initial=initial_state(settings),  # used by the first start only (commit 0)
                handle_signals=False,
                stopping=self.stopping,
            )
        )

    async def until(self, waiting: Awaitable[T]) -> T:
        """`waiting`'s result; the aggregator's error instead if it stops first."""
        wanted = asyncio.ensure_future(waiting)
        done, _ = await asyncio.wait(
            {wanted, self.task}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
        )
        if wanted in done:
            return wanted.result()
        wanted.cancel()
        if self.task in done:
            self.task.result()  # raises what stopped it
            raise AssertionError("the aggregator stopped before it was asked to")
        raise TimeoutError(f"nothing happened within {DEADLINE_S:g} s")

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.wait_for(self.task, DEADLINE_S)


async def policy_taken_in(settings: Settings, keys: Keys) -> None:
    """Return once the aggregator has read the policy record (a GET of it, seen by MONITOR,
    which is started after the change was written: that GET returned the new policy).

    On a connection of its own whose reads may wait as long as the whole wait: on a loaded
    machine the aggregator may send nothing for longer than the usual 5 s socket timeout."""
    patient = settings.redis.model_copy(update={"socket_timeout_s": DEADLINE_S})
    watcher = connect(patient)
    try:
        async with watcher.monitor() as monitor:
            while True:
                command = await monitor.next_command()
                words = command["command"].split(" ")
                if command["client_type"] != "lua" and [words[0].upper(), *words[1:]] == [
                    "GET",
                    keys.policy,
                ]:
                    return
    finally:
        await watcher.aclose()


async def decided(redis: aioredis.Redis, keys: Keys, entry_id: bytes) -> None:
    """Return once the ledger holds the decision about updates-stream entry `entry_id` (a
    blocking read of the ledger, no polling)."""
    cursor, wanted = "0-0", entry_id.decode()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        left = max(deadline - time.monotonic(), 0.0)
        for ledger_id, fields in await next_entries(redis, keys.ledger, cursor, left):
            cursor = ledger_id.decode()
            if msgpack.unpackb(fields[b"d"], raw=False)["stream_id"] == wanted:
                return


async def play(scenario: Scenario, settings: Settings, redis: aioredis.Redis) -> None:
    """Write the scenario phase by phase, in the order the module's docstring fixes, and return
    once every entry is decided and committed and the last aggregator has stopped."""
    keys = Keys(settings.redis.key_prefix)
    sent: dict[str, bytes] = {}
    aggregator: Aggregator | None = None
    try:
        for phase in scenario.phases:
            assert not isinstance(phase.entries[-1], Raw), "a phase ends with a decided entry"
            if phase.restart and aggregator is not None:
                await aggregator.stop()
                aggregator = None
            if phase.change is not None:
                current = await read_policy(redis, keys)
                new = current.evolve(**phase.change)
                await change_policy(redis, keys, new, who="golden", why="scenario", at=0.0)
                if aggregator is not None:
                    await aggregator.until(policy_taken_in(settings, keys))
            last = b""
            for entry in phase.entries:
                if isinstance(entry, Send):
                    sent[entry.update_id] = build_update(scenario, entry)
                    payload = sent[entry.update_id]
                elif isinstance(entry, Resend):
                    payload = sent[entry.update_id]
                else:
                    payload = entry.payload
                last = await publish(redis, keys, payload)
            if aggregator is None:
                aggregator = Aggregator(settings)
            await aggregator.until(decided(redis, keys, last))
    finally:
        if aggregator is not None:
            await aggregator.stop()


# --------------------------------------------------------------------------------- recording
def canonical(value: Any) -> Any:
    """JSON-safe and run-independent: bytes as their SHA-256 and length, maps with text keys."""
    if isinstance(value, bytes | bytearray):
        return {"sha256": hashlib.sha256(value).hexdigest(), "bytes": len(value)}
    if isinstance(value, Mapping):
        return {str(canonical_key(k)): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def canonical_key(key: Any) -> Any:
    return key.decode() if isinstance(key, bytes) else key


def line(kind: str, **fields: Any) -> str:
    return json.dumps({"kind": kind, **canonical(fields)}, sort_keys=True) + "\n"


async def number(redis: aioredis.Redis, key: str) -> int:
    raw: Any = await redis.get(key)
    return int(raw)


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def recorded(redis: aioredis.Redis, keys: Keys) -> str:
    """What the aggregator recorded under `keys`, as the golden file's text."""
    entries: Any = await redis.xrange(keys.updates)
    position = {text(entry_id): n for n, (entry_id, _) in enumerate(entries)}
    out: list[str] = []

    policies: Any = await redis.hgetall(keys.policies)
    for which in sorted(int(text(k)) for k in policies):
        out.append(line("policy", policy=json.loads(policies[str(which).encode()])))

    ledger_position: dict[str, int] = {}
    async for record in records(redis, keys):
        ledger_position[record.pop("ledger_id")] = len(ledger_position)
        record.pop("at")  # wall clock of the decision
        record["entry"] = position[record.pop("stream_id")]
        out.append(line("decision", n=len(ledger_position) - 1, **record))

    dead: Any = await redis.xrange(keys.deadletter)
    for _, fields in dead:
        letter = {text(k): v for k, v in fields.items()}
        letter.pop("at")  # wall clock of the commit
        entry = position[text(letter.pop("stream_id"))]
        out.append(
            line(
                "dead_letter",
                entry=entry,
                reason=text(letter.pop("reason")),
                detail=text(letter.pop("detail")),
                **letter,
            )
        )

    versions: Any = await redis.zrange(keys.models, 0, -1)
    for version in sorted(int(text(v)) for v in versions):
        model = msgpack.unpackb(await redis.get(keys.model(version)), raw=False)
        model.pop("created_at")  # wall clock of the commit
        out.append(line("model", **model))

    state = msgpack.unpackb(await redis.get(keys.state), raw=False)
    out.append(line("state", **state))

    memory: Any = await redis.hgetall(keys.memory)
    for client in sorted(memory, key=text):
        out.append(line("memory", client=text(client), delta=memory[client]))

    dedup: Any = await redis.zrange(keys.dedup, 0, -1, withscores=True)
    out.append(line("dedup", ids=sorted([text(i), int(k)] for i, k in dedup)))

    receipts: Any = await redis.hgetall(keys.receipts)
    order: Any = await redis.lrange(keys.receipts_order, 0, -1)
    for digest in order:
        out.append(
            line("receipt", digest=text(digest), decision=ledger_position[text(receipts[digest])])
        )

    done: Any = await redis.hgetall(keys.done)
    done.pop(b"at", None)  # wall clock of the commit
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    out.append(
        line(
            "final",
            version=await number(redis, keys.version),
            announced=await number(redis, keys.announced),
            commits=await number(redis, keys.commit_seq),
            done={text(k): text(v) for k, v in done.items()},
            entries=len(entries),
            pending=int(pending["pending"]),
        )
    )
    return "".join(out)


# --------------------------------------------------------------------------------- the test
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_the_aggregator_records_what_the_golden_ledger_holds(
    redis_server: RedisServer, redis: aioredis.Redis, scenario: Scenario
) -> None:
    """One redis-server for the module (conftest's), each scenario under its own prefix; `redis`
    is conftest's client of it (its key prefix is not used here)."""
    settings = settings_for(redis_server, scenario)
    keys = Keys(settings.redis.key_prefix)
    await play(scenario, settings, redis)

    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()  # the replay agrees with what was committed
    text_now = await recorded(redis, keys)
    path = GOLDEN / f"{scenario.name}.jsonl"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(text_now.encode())
        pytest.skip(f"GOLDEN_REGEN=1: wrote {path}; review `git diff tests/golden`")
    assert path.exists(), f"no {path}: write it with GOLDEN_REGEN=1 (see this module's docstring)"
    golden = path.read_bytes().decode()
    if text_now.encode() != path.read_bytes():
        diff = difflib.unified_diff(
            golden.splitlines(), text_now.splitlines(), str(path), "this run", lineterm="", n=0
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"{scenario.name}: what the aggregator recorded differs from {path}:\n{shown}")
