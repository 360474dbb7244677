"""Bounded Redis memory: payloads archived and trimmed, dedup ids kept by increments, claim-check
entries, and a Redis that refuses writes for want of memory met with retries, a metric and an
alert."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from fedasync.services.aggregator.service import Aggregator, run
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.alerts import REDIS_OOM
from fedasync.services.stores.archive import PayloadArchive
from fedasync.services.stores.claim_check import (
    ClaimError,
    ClaimStore,
    RedisClaimStore,
    address_of,
    claim_source,
)
from fedasync.services.stores.ledger import verify
from fedasync.shared import stream_entry
from fedasync.shared.keys import Keys
from fedasync.shared.wire import encode_update, unpack
from tests.integration.helpers import dead_letters, initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def archived(settings: Settings, folder: Path) -> Settings:
    return settings.model_copy(
        update={
            "aggregator": settings.aggregator.model_copy(
                update={"archive_dir": folder, "batch_max": 4, "port": None}
            )
        }
    )


async def test_archived_payloads_leave_the_stream_and_verify_reads_them_from_the_archive(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    keys = Keys(settings.redis.key_prefix)
    lean = archived(settings, tmp_path / "archive")
    for i in range(10):
        await publish(redis, keys, make_update(f"a{i}", base=0, value=float(i)))

    await run(lean, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True)

    records = await ledger(redis, keys)
    assert len(records) == 10
    assert await redis.xlen(keys.updates) <= 1  # trimmed below the last acknowledged entry
    archive = PayloadArchive(tmp_path / "archive", keys.prefix)
    assert all(archive.read(str(r["stream_id"])) is not None for r in records)
    report = await verify(redis, keys, settings.wire.max_message_bytes, archive)
    assert report.ok, report.describe()
    assert report.replayed == 10
    without = await verify(redis, keys, settings.wire.max_message_bytes)
    assert not without.ok
    assert "not kept" in without.mismatches[0]


async def test_dedup_ids_are_kept_beside_the_checkpoint_and_survive_a_restart(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    for i in range(3):
        await publish(redis, keys, make_update(f"d{i}", base=0))
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    raw_state = await get_bytes(redis, keys.state)
    assert raw_state is not None
    assert unpack(raw_state, len(raw_state))["dedup"]["ids"] is None  # not re-serialised
    assert await redis.zcard(keys.dedup) == 3

    await publish(redis, keys, make_update("d1", base=0))  # a retry, after a restart
    await run(settings, redis=redis, handle_signals=False, burst=True)

    outcomes = [(r["update_id"], r["outcome"]) for r in await ledger(redis, keys)]
    assert outcomes[-1] == ("d1", "duplicate")
    assert [o for _, o in outcomes[:3]] == ["applied"] * 3

    # ledger verify replays the ids too: the set as the commits left it matches, one lost not
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.state_matches
    await redis.zrem(keys.dedup, "d2")
    tampered = await verify(redis, keys, settings.wire.max_message_bytes)
    assert not tampered.state_matches
    assert "the dedup memory's ids differ from the replay's" in tampered.mismatches


async def test_a_commit_refused_for_want_of_memory_is_retried_counted_and_alerted(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    quiet = settings.model_copy(
        update={"aggregator": settings.aggregator.model_copy(update={"port": None})}
    )
    await run(quiet, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True)
    for i in range(3):
        await publish(redis, keys, make_update(f"m{i}", base=0))
    config: Any = await redis.config_get("maxmemory")
    before = config["maxmemory"]
    aggregator = Aggregator(quiet, redis, keys)
    refused = asyncio.Event()
    count_and_alert = aggregator.memory.refused

    async def on_oom(exc: BaseException) -> None:
        await count_and_alert(exc)
        refused.set()

    aggregator.memory.refused = on_oom  # type: ignore[method-assign]
    await redis.config_set("maxmemory", 1)  # every write that allocates is refused
    try:
        task = asyncio.create_task(_start_and_run(aggregator))
        await asyncio.wait_for(refused.wait(), 30)
        assert not task.done()  # retrying, not exited
    finally:
        await redis.config_set("maxmemory", before)
    result = await asyncio.wait_for(task, 60)

    assert result == 3
    assert [r["outcome"] for r in await ledger(redis, keys)] == ["applied"] * 3
    assert aggregator.metrics.redis_oom._value.get() >= 1
    alerts: Any = await redis.xrange(keys.alerts)
    messages = [f[b"message"].decode() for _, f in alerts if f[b"rule"] == REDIS_OOM.encode()]
    assert any("pass again" in m for m in messages)


async def _start_and_run(aggregator: Aggregator) -> int:
    await aggregator.start(None)
    result = await aggregator.run(asyncio.Event(), burst=True)
    return result.version


async def test_claim_check_entries_are_decided_from_the_store_and_bad_ones_refused(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    keys = Keys(settings.redis.key_prefix)
    store = ClaimStore(tmp_path / "objects")
    claimed = settings.model_copy(
        update={
            "wire": settings.wire.model_copy(update={"claim_check_dir": tmp_path / "objects"}),
            "aggregator": settings.aggregator.model_copy(
                update={"archive_dir": tmp_path / "archive", "port": None}
            ),
        }
    )
    good = [
        store.put(encode_update(make_update(f"c{i}", base=0, value=float(i)))) for i in range(3)
    ]
    tampered = store.put(encode_update(make_update("tampered", base=0)))
    (tmp_path / "objects" / tampered[7:9] / tampered[7:]).write_bytes(b"other bytes")
    for address in [*good, address_of(b"never stored"), tampered]:
        await redis.xadd(keys.updates, stream_entry.build_claim(address))

    await run(
        claimed, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )

    assert [r["outcome"] for r in await ledger(redis, keys)] == ["applied"] * 3
    reasons = [d[b"reason"].decode() for d in await dead_letters(redis, keys)]
    assert reasons == ["claim_missing", "claim_mismatch"]
    report = await verify(
        redis,
        keys,
        settings.wire.max_message_bytes,
        PayloadArchive(tmp_path / "archive", keys.prefix),
        store,
    )
    assert report.ok, report.describe()
    assert report.replayed == 3


async def test_redis_claim_store_round_trips_each_payload_in_its_own_slot(
    settings: Settings, redis: aioredis.Redis
) -> None:
    store = RedisClaimStore(redis, settings.redis.key_prefix)
    messages = [encode_update(make_update(f"r{i}", base=0, value=float(i))) for i in range(8)]
    addresses = [await store.put(m) for m in messages]
    assert addresses == [address_of(m) for m in messages]
    assert await store.put(messages[0]) == addresses[0]  # NX: once, the same address

    found = await store.fetch([*addresses, address_of(b"never stored"), "md5:00"])
    assert [found[a] for a in addresses] == messages
    missing, malformed = found[address_of(b"never stored")], found["md5:00"]
    assert isinstance(missing, ClaimError)
    assert isinstance(malformed, ClaimError)
    assert (missing.reason, malformed.reason) == ("claim_missing", "claim_missing")

    keys = [store.key_of(a) for a in addresses]
    assert all(
        k is not None and k.startswith(f"claim:{settings.redis.key_prefix}:{{") for k in keys
    )
    # the tag is the digest: every payload in a slot of its own, spread over a cluster's primaries
    assert len({key_slot(k.encode()) for k in keys if k is not None}) == len(keys)
    assert sorted(await store.stored()) == sorted(k for k in keys if k is not None)

    # Redis is not trusted to hold the bytes it was given: changed bytes are claim_mismatch
    tampered = keys[3]
    assert tampered is not None
    await redis.set(tampered, b"other bytes")
    changed = (await store.fetch([addresses[3]]))[addresses[3]]
    assert isinstance(changed, ClaimError)
    assert changed.reason == "claim_mismatch"


async def test_claim_check_entries_are_decided_from_redis_and_bad_ones_refused(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    """FEDASYNC_WIRE__CLAIM_CHECK_STORE=redis: the aggregator and `ledger verify` read the
    payloads from Redis, checked against their addresses, as from the directory."""
    keys = Keys(settings.redis.key_prefix)
    claimed = settings.model_copy(
        update={
            "wire": settings.wire.model_copy(update={"claim_check_store": "redis"}),
            "aggregator": settings.aggregator.model_copy(
                update={"archive_dir": tmp_path / "archive", "port": None}
            ),
        }
    )
    store = claim_source(
        claimed.wire.claim_check_store, claimed.wire.claim_check_dir, redis, keys.prefix
    )
    assert isinstance(store, RedisClaimStore)
    good = [
        await store.put(encode_update(make_update(f"c{i}", base=0, value=float(i))))
        for i in range(3)
    ]
    tampered = await store.put(encode_update(make_update("tampered", base=0)))
    key = store.key_of(tampered)
    assert key is not None
    await redis.set(key, b"other bytes")
    for address in [*good, address_of(b"never stored"), tampered]:
        await redis.xadd(keys.updates, stream_entry.build_claim(address))

    await run(
        claimed, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )

    assert [r["outcome"] for r in await ledger(redis, keys)] == ["applied"] * 3
    reasons = [d[b"reason"].decode() for d in await dead_letters(redis, keys)]
    assert reasons == ["claim_missing", "claim_mismatch"]
    report = await verify(
        redis,
        keys,
        settings.wire.max_message_bytes,
        PayloadArchive(tmp_path / "archive", keys.prefix),
        store,
    )
    assert report.ok, report.describe()
    assert report.replayed == 3
