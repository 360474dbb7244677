"""Device authentication in the real aggregator, against a real Redis.

Forged, replayed, unsigned, wrong-client, unknown and revoked updates are dead-lettered with
their reason and counted; a properly signed update is applied; keys added or revoked while the
aggregator runs take effect without a restart, within the documented cache bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import Aggregator, run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import KeyCache, add_device, revoke_device
from fedasync.services.stores.ledger import verify as verify_ledger
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import parse_key, sign
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import dead_letters, initial_state, ledger, make_update

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

HOUR_MS = 3_600_000


def required(settings: Settings) -> Settings:
    auth = settings.auth.model_copy(update={"required": True, "window_s": 300.0})
    return settings.model_copy(update={"auth": auth})


async def redis_ms(redis: aioredis.Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def publish_signed(
    redis: aioredis.Redis,
    keys: Keys,
    update: Update,
    key: bytes,
    *,
    signer: str | None = None,
    signed_at_ms: int | None = None,
) -> bytes:
    raw = encode_update(update)
    when = signed_at_ms if signed_at_ms is not None else await redis_ms(redis)
    fields: dict[str, bytes | str] = stream_entry.build(
        raw, sign(key, signer or update.client_id, when, raw)
    )
    entry_id: bytes = await redis.xadd(keys.updates, fields)  # type: ignore[arg-type]
    return entry_id


def refusal_count(aggregator_metrics: Any, reason: str) -> float:
    value = aggregator_metrics.registry.get_sample_value(
        "fedasync_aggregator_rejections_total", {"reason": reason}
    )
    return float(value or 0.0)


async def test_only_the_properly_signed_update_is_applied(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = required(settings)
    keys = Keys(settings.redis.key_prefix)
    key = parse_key(await add_device(redis, keys, "dev-a"))
    other = parse_key(await add_device(redis, keys, "dev-b"))
    revoked = parse_key(await add_device(redis, keys, "dev-r"))
    await revoke_device(redis, keys, "dev-r")
    now = await redis_ms(redis)

    await publish_signed(redis, keys, make_update("good", 0, client="dev-a"), key)
    await redis.xadd(
        keys.updates, stream_entry.build(encode_update(make_update("unsigned", 0, client="dev-a")))
    )
    # forged: signed for dev-a with dev-b's key
    await publish_signed(redis, keys, make_update("forged", 0, client="dev-a"), other)
    # replayed: a valid signature made an hour before Redis received the entry
    await publish_signed(
        redis, keys, make_update("replayed", 0, client="dev-a"), key, signed_at_ms=now - HOUR_MS
    )
    # wrong client: dev-b signs correctly, but the message claims to come from dev-a
    await publish_signed(
        redis, keys, make_update("wrong-client", 0, client="dev-a"), other, signer="dev-b"
    )
    await publish_signed(redis, keys, make_update("revoked", 0, client="dev-r"), revoked)
    await publish_signed(redis, keys, make_update("unknown", 0, client="dev-x"), key)
    # a malformed signature: t is not a number
    await redis.xadd(
        keys.updates,
        stream_entry.build(encode_update(make_update("bad-t", 0, client="dev-a")))
        | {stream_entry.CLIENT: "dev-a", stream_entry.SIGNED_AT: "soon"}
        | {stream_entry.SIGNATURE: "0" * 64},
    )

    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    result = await aggregator.run(asyncio.Event(), burst=True)

    assert result.version == 1
    assert [(e["update_id"], e["outcome"]) for e in await ledger(redis, keys)] == [
        ("good", "applied")
    ]
    dead = [(d[b"reason"].decode(), d[b"stream_id"]) for d in await dead_letters(redis, keys)]
    assert [reason for reason, _ in dead] == [
        "unsigned",
        "bad_signature",
        "signature_expired",
        "client_mismatch",
        "revoked",
        "unknown_device",
        "malformed_signature",
    ]
    for reason, _ in dead:
        assert refusal_count(aggregator.metrics, reason) == 1.0
    authenticated = aggregator.metrics.registry.get_sample_value(
        "fedasync_aggregator_authenticated_total"
    )
    assert authenticated == 2.0  # the good one, and dev-b's wrong-client one before its claim
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0  # every refusal is recorded and acknowledged, none lost
    report = await verify_ledger(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_a_forgery_under_a_real_update_id_does_not_block_the_genuine_update(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = required(settings)
    keys = Keys(settings.redis.key_prefix)
    key = parse_key(await add_device(redis, keys, "dev-a"))
    await publish_signed(redis, keys, make_update("u1", 0, client="dev-a"), bytes(32))
    await publish_signed(redis, keys, make_update("u1", 0, client="dev-a"), key)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert [(e["update_id"], e["outcome"]) for e in await ledger(redis, keys)] == [
        ("u1", "applied")
    ]


async def test_unsigned_updates_are_still_applied_when_signatures_are_not_required(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await redis.xadd(keys.updates, stream_entry.build(encode_update(make_update("plain", 0))))
    await publish_signed(redis, keys, make_update("forged", 0), bytes(32))  # still checked
    result = await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert result.version == 1
    assert [e["update_id"] for e in await ledger(redis, keys)] == ["plain"]
    assert [d[b"reason"] for d in await dead_letters(redis, keys)] == [b"unknown_device"]


async def test_a_redelivery_after_an_outage_is_judged_by_when_redis_received_it(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """The window is measured against the entry id, so an aggregator that comes back after
    longer than the window still applies updates devices sent in time."""
    settings = required(settings)
    keys = Keys(settings.redis.key_prefix)
    key = parse_key(await add_device(redis, keys, "dev-a"))
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    # an entry Redis received two hours ago (explicit id), signed one second before that
    received = await redis_ms(redis) - 2 * HOUR_MS
    raw = encode_update(make_update("late", 0, client="dev-a"))
    fields = stream_entry.build(raw, sign(key, "dev-a", received - 1000, raw))
    await redis.xadd(keys.updates, fields, id=f"{received}-0")  # type: ignore[arg-type]
    await run(settings, redis=redis, handle_signals=False, burst=True)
    assert [(e["update_id"], e["outcome"]) for e in await ledger(redis, keys)] == [
        ("late", "applied")
    ]


async def test_keys_added_and_revoked_at_runtime_take_effect_without_restart(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = required(settings)
    keys = Keys(settings.redis.key_prefix)
    refresh_s = settings.auth.key_refresh_s
    clock = [1000.0]
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    # the same cache as in production, with a clock the test moves instead of sleeping
    aggregator.decider.device_keys = KeyCache(redis, keys, refresh_s, clock=lambda: clock[0])
    stopping = asyncio.Event()
    not_yet = bytes(range(32))

    await publish_signed(redis, keys, make_update("before-add", 0, client="dev-n"), not_yet)
    await aggregator.run(stopping, burst=True)
    key = parse_key(await add_device(redis, keys, "dev-n"))
    await publish_signed(redis, keys, make_update("after-add", 0, client="dev-n"), key)
    await aggregator.run(stopping, burst=True)  # the same aggregator: a miss is re-read at once

    await revoke_device(redis, keys, "dev-n")
    clock[0] += refresh_s / 2  # inside the bound: the cached key may still be used
    await publish_signed(redis, keys, make_update("within-bound", 1, client="dev-n"), key)
    await aggregator.run(stopping, burst=True)
    clock[0] += refresh_s  # past the bound: the key is re-read, and is gone
    await publish_signed(redis, keys, make_update("after-revoke", 2, client="dev-n"), key)
    await aggregator.run(stopping, burst=True)

    assert [(e["update_id"], e["outcome"]) for e in await ledger(redis, keys)] == [
        ("after-add", "applied"),
        ("within-bound", "applied"),
    ]
    assert [d[b"reason"] for d in await dead_letters(redis, keys)] == [
        b"unknown_device",
        b"revoked",
    ]
