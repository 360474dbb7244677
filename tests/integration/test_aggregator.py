"""The aggregator against a real Redis: commits, duplicates, redelivery, fencing, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Fenced
from fedasync.services.aggregator.service import Aggregator, run
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.services.stores.policy_store import change_policy, read_policy
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.wire import pack
from tests.integration.helpers import (
    dead_letters,
    initial_state,
    ledger,
    make_update,
    publish,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def keys_of(settings: Settings) -> Keys:
    return Keys(settings.redis.key_prefix)


async def committed_model(redis: aioredis.Redis, keys: Keys) -> Any:
    version = int(await get_bytes(redis, keys.version) or 0)
    raw = await get_bytes(redis, keys.model(version))
    assert raw is not None
    return decode_model(raw).snapshot


async def test_updates_are_applied_committed_and_acknowledged(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    expected = initial_state(settings)
    for i in range(5):
        update = make_update(f"u{i}", base=max(i - 1, 0), value=float(i))
        await publish(redis, keys, update)
        expected.apply(update, settings.policy.to_policy())

    result = await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )

    assert result.version == 5
    model = await committed_model(redis, keys)
    assert model.version == 5
    assert model.weights.tobytes() == expected.weights_view().tobytes()
    entries = await ledger(redis, keys)
    assert [e["outcome"] for e in entries] == ["applied"] * 5
    assert [e["version"] for e in entries] == [1, 2, 3, 4, 5]
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_same_update_published_twice_is_applied_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    update = make_update("twice", base=0)
    await publish(redis, keys, update)
    await publish(redis, keys, update)  # a device retry with the same update id
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    entries = await ledger(redis, keys)
    assert [(e["update_id"], e["outcome"]) for e in entries] == [
        ("twice", "applied"),
        ("twice", "duplicate"),
    ]
    assert (await committed_model(redis, keys)).version == 1


async def test_redelivered_after_a_crash_before_commit_is_applied_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    for i in range(3):
        await publish(redis, keys, make_update(f"r{i}", base=0))
    # an aggregator reads the entries (they become pending) and dies before its commit
    await redis.xreadgroup(AGGREGATOR_GROUP, "dead-consumer", {keys.updates: ">"}, count=10)
    await run(settings, redis=redis, handle_signals=False, burst=True)
    entries = await ledger(redis, keys)
    assert sorted(e["update_id"] for e in entries) == ["r0", "r1", "r2"]
    assert all(e["outcome"] == "applied" for e in entries)
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    # run again: nothing is decided a second time
    await run(settings, redis=redis, handle_signals=False, burst=True)
    assert len(await ledger(redis, keys)) == 3


async def test_second_aggregator_fences_off_the_first(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    first = Aggregator(settings, redis, keys)
    await first.start(initial_state(settings))
    second = Aggregator(settings, redis, keys)
    await second.start(None)
    await publish(redis, keys, make_update("x", base=0))
    with pytest.raises(Fenced):
        await first.run(asyncio.Event(), burst=True)
    result = await second.run(asyncio.Event(), burst=True)
    assert result.version == 1


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1not msgpack", "malformed"),
        (pack({"schema": 9}), "unknown_schema"),
        (b"\x00" * 2048, "too_large"),
        (
            pack(
                {
                    "schema": 1,
                    "update_id": "d",
                    "client_id": "c",
                    "base_version": 0,
                    "num_samples": 1,
                    "created_at": 0.0,
                    "weights": {"dtype": "float64", "shape": [8], "data": b"\x00" * 64},
                }
            ),
            "bad_dtype",
        ),
    ],
)
async def test_undecodable_messages_are_dead_lettered_and_acknowledged(
    settings: Settings, redis: aioredis.Redis, payload: bytes, reason: str
) -> None:
    keys = keys_of(settings)
    tight = settings.model_copy(
        update={"wire": settings.wire.model_copy(update={"max_message_bytes": 1024})}
    )
    await publish(redis, keys, payload)
    await run(tight, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True)
    dead = await dead_letters(redis, keys)
    assert [d[b"reason"].decode() for d in dead] == [reason]
    assert (await committed_model(redis, keys)).version == 0
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0


@pytest.mark.parametrize(
    ("weights", "base", "reason"),
    [
        (np.ones(3, np.float32), 0, "shape_mismatch"),
        (np.ones(8, np.float16), 5, "future_base_version"),
    ],
)
async def test_invalid_updates_are_rejected_in_the_ledger_and_dead_lettered(
    settings: Settings, redis: aioredis.Redis, weights: np.ndarray, base: int, reason: str
) -> None:
    keys = keys_of(settings)
    update = make_update("bad", base=base)
    bad = type(update)("bad", "c0", base, 10, weights)
    await publish(redis, keys, bad)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert [(e["outcome"], e["reason"]) for e in await ledger(redis, keys)] == [
        ("rejected", reason)
    ]
    assert [d[b"reason"].decode() for d in await dead_letters(redis, keys)] == [reason]
    model = await committed_model(redis, keys)
    assert model.version == 0
    assert model.weights.tobytes() == initial_state(settings).weights_view().tobytes()


async def test_nan_payload_is_dead_lettered(settings: Settings, redis: aioredis.Redis) -> None:
    keys = keys_of(settings)
    message: dict[str, Any] = msgpack.unpackb(
        __import__("fedasync.shared.wire", fromlist=["encode_update"]).encode_update(
            make_update("n", 0)
        ),
        raw=False,
    )
    message["weights"]["data"] = np.full(8, np.nan, "<f4").tobytes()
    await publish(redis, keys, pack(message))
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert [d[b"reason"].decode() for d in await dead_letters(redis, keys)] == ["non_finite"]


async def test_policy_change_takes_effect_and_is_recorded(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    current = await read_policy(redis, keys)
    await change_policy(redis, keys, current.evolve(alpha0=0.3), who="test", why="calmer", at=0.0)
    await publish(redis, keys, make_update("p", base=0))
    await run(settings, redis=redis, handle_signals=False, burst=True)
    [entry] = await ledger(redis, keys)
    assert (entry["policy_version"], entry["alpha"]) == (1, 0.3)
    assert (await verify(redis, keys, settings.wire.max_message_bytes)).ok


async def test_update_budget_closes_training_and_marks_done(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    small = settings.model_copy(
        update={"budget": settings.budget.model_copy(update={"max_updates": 2})}
    )
    for i in range(4):
        await publish(redis, keys, make_update(f"b{i}", base=i if i < 2 else 2))
    result = await run(
        small, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert (result.version, result.closed) == (2, "max_updates")
    outcomes = [(e["outcome"], e["reason"]) for e in await ledger(redis, keys)]
    assert outcomes == [("applied", None)] * 2 + [("dropped", "closed")] * 2
    done: Any = await redis.hgetall(keys.done)
    assert done[b"reason"] == b"max_updates"
    assert (await verify(redis, keys, settings.wire.max_message_bytes)).ok


async def test_time_budget_closes_training(settings: Settings, redis: aioredis.Redis) -> None:
    keys = keys_of(settings)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    await redis.set(keys.started, repr(0.0))  # training "started" in 1970: the budget is spent
    await publish(redis, keys, make_update("late", base=0))
    result = await run(settings, redis=redis, handle_signals=False, burst=True)
    assert result.closed == "max_seconds"
    assert [(e["outcome"], e["reason"]) for e in await ledger(redis, keys)] == [
        ("dropped", "closed")
    ]
    done: Any = await redis.hgetall(keys.done)
    assert done[b"reason"] == b"max_seconds"


async def test_without_audit_the_stream_is_trimmed_only_below_what_is_acknowledged(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = keys_of(settings)
    lean = settings.model_copy(
        update={
            "aggregator": settings.aggregator.model_copy(
                update={"keep_payloads": False, "batch_max": 4}
            )
        }
    )
    for i in range(10):
        await publish(redis, keys, make_update(f"t{i}", base=0))
    await run(lean, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True)
    assert len(await ledger(redis, keys)) == 10
    remaining: Any = await redis.xrange(keys.updates)
    assert len(remaining) < 10  # trimmed ...
    last_acked = (await ledger(redis, keys))[-1]["stream_id"]
    assert [i.decode() for i, _ in remaining][-1] == last_acked  # ... never past the last ack
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert not report.ok
    assert "not kept" in report.describe()
