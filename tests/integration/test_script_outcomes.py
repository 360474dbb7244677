"""Every outcome a Lua script names is the one it returns in the situation the name says.

The outcomes are StrEnums (services/runtime/lua.py makes each script's `Outcome` table from its
caller's enum); each test below is one member, and the completeness test fails when a member is
added without one. Refused outcomes write nothing: checked on what the script would write.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.aggregator.commit import (
    Batch,
    CommitConflict,
    CommitOutcome,
    Committer,
    Fenced,
    LedgerEntry,
)
from fedasync.services.ingest.store import (
    IngestOutcome,
    IngestStore,
    KeyChanged,
    RunDone,
    SignedOutsideWindow,
    UpdateIdReused,
)
from fedasync.services.runtime import lua
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import (
    ED25519,
    HMAC,
    add_device,
    fingerprint,
    revoke_device,
)
from fedasync.services.stores.policy_store import (
    PolicyChange,
    PolicyConflict,
    SwitchChange,
    change_policy,
    ensure_policy,
)
from fedasync.shared.continuity import Check
from fedasync.shared.device_auth import Proof
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.policy import Policy

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: the outcomes each test below covers, one test per member
COVERED: dict[type[StrEnum], set[StrEnum]] = {
    CommitOutcome: set(),
    IngestOutcome: set(),
    PolicyChange: set(),
}


def covers(member: StrEnum) -> Callable[[Callable[..., Awaitable[None]]], Any]:
    COVERED[type(member)].add(member)
    return lambda test: test


async def test_every_outcome_has_its_test() -> None:
    """Collected after the module ran its decorators: each enum member has a test below."""
    for outcomes, covered in COVERED.items():
        assert covered == set(outcomes), outcomes.__name__


# -- the commit --------------------------------------------------------------------------------


async def pending_entries(redis: aioredis.Redis, keys: Keys, n: int) -> list[bytes]:
    """`n` entries of the updates stream, delivered to the aggregator's group (pending)."""
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
    ids: list[Any] = [await redis.xadd(keys.updates, {"m": b"\x00\xff"}) for _ in range(n)]
    await redis.xreadgroup(AGGREGATOR_GROUP, "a", {keys.updates: ">"})
    return ids


def batch(version: int, acks: list[bytes]) -> Batch:
    return Batch(
        state=b"\x00state\xff",
        version=version,
        model=b"\x80model\x00",
        ledger=[LedgerEntry(record=b"\x81rec", receipt=f"r{version}")],
        acks=acks,
    )


async def written(redis: aioredis.Redis, keys: Keys) -> tuple[Any, ...]:
    """What a commit writes."""
    return (
        await redis.get(keys.commit_seq),
        await redis.get(keys.state),
        await redis.get(keys.version),
        await redis.xlen(keys.ledger),
        await redis.xpending(keys.updates, AGGREGATOR_GROUP),
    )


async def committer(redis: aioredis.Redis, keys: Keys, epoch: int = 1) -> Committer:
    await redis.set(keys.epoch, epoch)
    return Committer(redis, keys, epoch=epoch, seq=0, keep_versions=2)


@covers(CommitOutcome.COMMITTED)
async def test_a_commit_that_follows_the_sequence_is_committed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    acks = await pending_entries(redis, keys, 2)
    commits = await committer(redis, keys)
    assert await commits.commit(batch(1, acks), now=1.5) is CommitOutcome.COMMITTED
    assert await redis.get(keys.commit_seq) == b"1"
    assert await redis.get(keys.state) == b"\x00state\xff"
    assert await redis.get(keys.model(1)) == b"\x80model\x00"
    rows: Any = await redis.xrange(keys.ledger)
    (_, fields), *_ = rows
    assert fields == {b"d": b"\x81rec"}
    assert (await redis.xpending(keys.updates, AGGREGATOR_GROUP))["pending"] == 0


@covers(CommitOutcome.IN_PLACE)
async def test_a_commit_sent_again_after_a_lost_reply_is_in_place(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    acks = await pending_entries(redis, keys, 1)
    commits = await committer(redis, keys)
    await commits.commit(batch(1, acks), now=1.5)
    before = await written(redis, keys)
    commits.seq = 0  # as if the reply to the first attempt had been lost
    assert await commits.commit(batch(1, acks), now=2.5) is CommitOutcome.IN_PLACE
    assert commits.seq == 1
    assert await written(redis, keys) == before


@covers(CommitOutcome.FENCED)
async def test_a_commit_from_an_older_epoch_is_fenced(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    acks = await pending_entries(redis, keys, 1)
    commits = await committer(redis, keys)
    await redis.incr(keys.epoch)  # a second aggregator started
    before = await written(redis, keys)
    with pytest.raises(Fenced, match="fenced off by epoch b'2'"):
        await commits.commit(batch(1, acks), now=1.5)
    assert await written(redis, keys) == before


@covers(CommitOutcome.SEQ_MOVED)
async def test_a_commit_whose_sequence_moved_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    acks = await pending_entries(redis, keys, 1)
    commits = await committer(redis, keys)
    await redis.set(keys.commit_seq, 5)  # moved by someone, same epoch
    before = await written(redis, keys)
    with pytest.raises(CommitConflict, match="commit sequence is 5, expected 0") as refused:
        await commits.commit(batch(1, acks), now=1.5)
    assert refused.value.check is Check.COMMIT_SEQ_MOVED
    assert await written(redis, keys) == before


@covers(CommitOutcome.LOST_DELIVERY)
async def test_a_commit_acknowledging_an_entry_not_pending_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    pending = await pending_entries(redis, keys, 1)
    never_read: Any = await redis.xadd(keys.updates, {"m": b"x"})
    commits = await committer(redis, keys)
    before = await written(redis, keys)
    with pytest.raises(CommitConflict, match=f"entry {never_read.decode()} is not pending"):
        await commits.commit(batch(1, [*pending, never_read]), now=1.5)
    assert (await redis.xpending(keys.updates, AGGREGATOR_GROUP))["pending"] == 1
    assert await written(redis, keys) == before


# -- the idempotent XADD -----------------------------------------------------------------------


async def ingest_store(redis: aioredis.Redis, settings: Settings) -> tuple[IngestStore, int, str]:
    """A store with a day's window, Redis's time now (ms): the time the script judges by, and
    the fingerprint of the key device c0 is given."""
    seconds, micros = await redis.time()
    keys = Keys(settings.redis.key_prefix)
    store = IngestStore(redis, keys, ttl_s=60, window_ms=86_400_000)
    key = fingerprint(await add_device(redis, keys, "c0", HMAC))
    return store, seconds * 1000 + micros // 1000, key


@covers(IngestOutcome.ADDED)
async def test_a_first_update_is_added(settings: Settings, redis: aioredis.Redis) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    added = await store.add("c0", "u1", b"\x00body\xff", Proof("c0", now_ms, b"\x01" * 32), key)
    assert added.new
    rows: Any = await redis.xrange(Keys(settings.redis.key_prefix).updates)
    ((entry_id, fields),) = rows
    assert entry_id.decode() == added.entry_id
    assert b"\x00body\xff" in fields.values()


@covers(IngestOutcome.ALREADY_ADDED)
async def test_the_same_update_again_is_already_added(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    proof = Proof("c0", now_ms, b"\x01" * 32)
    first = await store.add("c0", "u1", b"body", proof, key)
    again = await store.add("c0", "u1", b"body", proof, key)
    assert (again.entry_id, again.new) == (first.entry_id, False)
    assert await redis.xlen(Keys(settings.redis.key_prefix).updates) == 1


@covers(IngestOutcome.UPDATE_ID_REUSED)
async def test_the_same_update_id_with_another_body_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    proof = Proof("c0", now_ms, b"\x01" * 32)
    first = await store.add("c0", "u1", b"body", proof, key)
    with pytest.raises(UpdateIdReused) as refused:
        await store.add("c0", "u1", b"other body", proof, key)
    assert refused.value.entry_id == first.entry_id
    assert await redis.xlen(Keys(settings.redis.key_prefix).updates) == 1


@covers(IngestOutcome.SIGNED_OUTSIDE_WINDOW)
async def test_an_update_signed_outside_the_window_is_not_added(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    two_days_ago = now_ms - 2 * 86_400_000
    with pytest.raises(SignedOutsideWindow):
        await store.add("c0", "u1", b"body", Proof("c0", two_days_ago, b"\x01" * 32), key)
    keys = Keys(settings.redis.key_prefix)
    assert await redis.xlen(keys.updates) == 0
    assert await redis.keys(keys.ingested("*")) == []


@covers(IngestOutcome.KEY_CHANGED)
async def test_an_update_checked_with_a_key_since_rotated_is_not_added(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    keys = Keys(settings.redis.key_prefix)
    await add_device(redis, keys, "c0", ED25519)  # rotated after ingest read the key
    with pytest.raises(KeyChanged):
        await store.add("c0", "u1", b"body", Proof("c0", now_ms, b"\x01" * 32), key)
    await revoke_device(redis, keys, "c0")  # ... and revoked: no key at all
    with pytest.raises(KeyChanged):
        await store.add("c0", "u1", b"body", Proof("c0", now_ms, b"\x01" * 32), key)
    assert await redis.xlen(keys.updates) == 0
    assert await redis.keys(keys.ingested("*")) == []


@covers(IngestOutcome.RUN_DONE)
async def test_a_new_update_for_a_run_that_finished_is_not_added_and_a_retry_is_answered(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store, now_ms, key = await ingest_store(redis, settings)
    keys = Keys(settings.redis.key_prefix)
    proof = Proof("c0", now_ms, b"\x01" * 32)
    first = await store.add("c0", "u1", b"body", proof, key)
    await redis.hset(keys.done, mapping={"reason": "max_updates", "version": 3, "at": 1.0})
    with pytest.raises(RunDone) as refused:
        await store.add("c0", "u2", b"body", proof, key)
    assert refused.value.reason == "max_updates"
    again = await store.add("c0", "u1", b"body", proof, key)
    assert (again.entry_id, again.new) == (first.entry_id, False)
    assert await redis.xlen(keys.updates) == 1


# -- the policy change -------------------------------------------------------------------------


async def installed(settings: Settings, redis: aioredis.Redis) -> tuple[Keys, Policy]:
    keys = Keys(settings.redis.key_prefix)
    return keys, await ensure_policy(redis, keys, settings.policy.to_policy())


async def policy_records(redis: aioredis.Redis, keys: Keys) -> tuple[Any, ...]:
    """What a change writes."""
    return (
        await redis.get(keys.policy),
        await redis.hgetall(keys.policies),
        await redis.lrange(keys.policy_log, 0, -1),
        await redis.hgetall(keys.switches),
    )


@covers(PolicyChange.CHANGED)
async def test_a_change_from_the_version_in_force_is_changed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys, policy = await installed(settings, redis)
    new = policy.evolve(alpha0=0.25)
    after = json.dumps({"who": "ops"})
    change = SwitchChange("raise-gamma", before=None, after=after)
    await change_policy(redis, keys, new, who="ops", why="test", at=1.0, switch=change)
    in_force: Any = await redis.get(keys.policy)
    assert json.loads(in_force)["version"] == new.version
    assert await redis.hget(keys.policies, str(new.version)) == await redis.get(keys.policy)
    assert await redis.llen(keys.policy_log) == 1
    assert await redis.hget(keys.switches, "raise-gamma") == after.encode()


@covers(PolicyChange.VERSION_MOVED)
async def test_a_change_from_a_version_no_longer_in_force_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys, policy = await installed(settings, redis)
    await change_policy(redis, keys, policy.evolve(alpha0=0.25), who="a", why="1", at=1.0)
    before = await policy_records(redis, keys)
    with pytest.raises(PolicyConflict, match="no longer the one in force"):
        await change_policy(redis, keys, policy.evolve(alpha0=0.75), who="b", why="2", at=2.0)
    assert await policy_records(redis, keys) == before


@covers(PolicyChange.SWITCH_MOVED)
async def test_a_change_whose_switch_record_moved_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys, policy = await installed(settings, redis)
    await redis.hset(keys.switches, "raise-gamma", json.dumps({"who": "elsewhere"}))
    before = await policy_records(redis, keys)
    change = SwitchChange("raise-gamma", before=None, after=json.dumps({"who": "me"}))
    with pytest.raises(PolicyConflict, match="switch raise-gamma changed"):
        await change_policy(
            redis, keys, policy.evolve(alpha0=0.25), who="me", why="on", at=1.0, switch=change
        )
    assert await policy_records(redis, keys) == before


@covers(PolicyChange.VERSION_RECORDED)
async def test_a_change_to_a_version_already_in_the_history_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys, policy = await installed(settings, redis)
    new = policy.evolve(alpha0=0.25)
    await redis.hsetnx(keys.policies, str(new.version), "{}")  # the records disagree
    before = await policy_records(redis, keys)
    with pytest.raises(PolicyConflict, match="already in the history"):
        await change_policy(redis, keys, new, who="ops", why="test", at=1.0)
    assert await policy_records(redis, keys) == before


# -- the loader --------------------------------------------------------------------------------


class Answer(StrEnum):
    YES = "yes"


async def test_a_name_the_enum_lacks_is_an_error_in_the_script(redis: aioredis.Redis) -> None:
    script = lua.LuaScript("test", lua.prelude(Answer) + "return {Outcome.YES, Outcome.NO}")
    with pytest.raises(ResponseError, match="Answer has no outcome NO"):
        await script(redis, keys=[], args=[])
    yes = lua.LuaScript("test", lua.prelude(Answer) + "return Outcome.YES")
    assert lua.outcome(Answer, await yes(redis, keys=[], args=[])) is Answer.YES


async def test_named_values_reach_the_script_byte_for_byte(redis: aioredis.Redis) -> None:
    """Bytes no JSON could carry (NUL, invalid UTF-8) arrive as they were sent, by name."""
    blob = bytes(range(256))
    args = lua.ScriptArgs(count=3, label="é")
    args.value("blob", blob)
    args.section("rows", a=[b"\xff", b"", b"\x00"], b=["x", "y", "z"])
    source = """
    local f = cjson.decode(ARGV[1])
    local out = {ARGV[f.at.blob], f.label, tostring(f.count), tostring(f.rows.n)}
    for k = 0, f.rows.n - 1 do
      out[#out + 1] = ARGV[f.rows.a + k] .. ARGV[f.rows.b + k]
    end
    return out
    """
    reply = await lua.LuaScript("test", source)(redis, keys=[], args=args.argv())
    assert reply == [blob, "é".encode(), b"3", b"3", b"\xffx", b"y", b"\x00z"]
