"""The receipts index the commit writes: first decision wins, bounded oldest first, atomic with
the ledger entry it names, checked by `ledger verify`. The real aggregator in burst mode."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Batch, Committer, LedgerEntry
from fedasync.services.aggregator.service import run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import receipts
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import Keys, update_digest
from fedasync.shared.wire import pack
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def keys_of(settings: Settings) -> Keys:
    return Keys(settings.redis.key_prefix)


async def decide(settings: Settings, redis: aioredis.Redis, *, first: bool = True) -> None:
    initial = initial_state(settings) if first else None
    await run(settings, redis=redis, initial=initial, handle_signals=False, burst=True)


async def test_a_receipt_is_the_first_decision_and_a_duplicate_does_not_replace_it(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    update = make_update("twice", base=0)
    await publish(redis, keys, update)
    await publish(redis, keys, update)  # published again straight to the stream
    await publish(redis, keys, make_update("twice", base=0, client="c1"))  # another device's
    await decide(settings, redis)
    first, again, other = await ledger(redis, keys)
    assert [r["outcome"] for r in (first, again, other)] == ["applied", "duplicate", "duplicate"]
    mine = await receipts.lookup(redis, keys, "c0", "twice")
    assert mine == first  # the applied decision, not the later duplicate
    # the same update id from another device has its own receipt (dedup is by update id alone)
    assert await receipts.lookup(redis, keys, "c1", "twice") == other
    assert await receipts.lookup(redis, keys, "c2", "twice") is None
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.receipts == 2


async def test_the_index_keeps_the_newest_receipts_up_to_its_capacity(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(
        update={"receipts": settings.receipts.model_copy(update={"capacity": 3})}
    )
    keys = keys_of(settings)
    for i in range(5):
        await publish(redis, keys, make_update(f"u{i}", base=i))
    await decide(settings, redis)
    for i in range(5, 7):  # a second run of the aggregator, a second batch
        await publish(redis, keys, make_update(f"u{i}", base=i))
    await decide(settings, redis, first=False)
    kept = [await receipts.lookup(redis, keys, "c0", f"u{i}") for i in range(7)]
    assert [r is not None for r in kept] == [False] * 4 + [True] * 3
    assert await redis.hlen(keys.receipts) == await redis.llen(keys.receipts_order) == 3
    order: Any = await redis.lrange(keys.receipts_order, 0, -1)
    assert [o.decode() for o in order] == [update_digest("c0", f"u{i}") for i in range(4, 7)]
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.receipts == 3


async def test_a_retried_commit_writes_its_receipts_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A commit whose reply was lost is sent again: the sequence check makes the second one
    write nothing, receipts included."""
    keys = keys_of(settings)
    await redis.incr(keys.epoch)
    record = pack({"update_id": "u", "client_id": "c0", "outcome": "applied"})
    batch = Batch(b"state", 0, b"", ledger=[LedgerEntry(record, update_digest("c0", "u"))])
    committer = Committer(redis, keys, epoch=1, seq=0, keep_versions=2)
    await committer.commit(batch, now=1.0)
    committer.seq = 0  # as if the reply of the first had been lost
    await committer.commit(batch, now=1.0)
    assert await redis.xlen(keys.ledger) == 1
    assert await redis.hlen(keys.receipts) == await redis.llen(keys.receipts_order) == 1


async def test_verify_finds_a_receipt_that_names_another_update(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    for name in ("a", "b"):
        await publish(redis, keys, make_update(name, base=0))
    await decide(settings, redis)
    a, b = await ledger(redis, keys)
    await redis.hset(keys.receipts, update_digest("c0", "a"), b["ledger_id"])  # corrupted
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert not report.ok
    assert report.mismatches == [
        f"{a['ledger_id']}: the receipt of c0/a names {b['ledger_id']}, "
        "a decision about another update"
    ]
