"""The aggregator's deciding part: each entry of a read into the batch, as a decision recorded
or a dead letter, and the state closed when its budget is spent. The entries are read from a
real Redis stream, as the reader gets them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Batch
from fedasync.services.aggregator.deciding import Decider
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.reader import Entry
from fedasync.services.ingest.store import IngestStore
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import (
    ED25519,
    HMAC,
    KeyCache,
    add_device,
    revoke_device,
)
from fedasync.services.stores.ingest_markers import IngestMarkers
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import Proof, parse_key, sign
from fedasync.shared.keys import Keys, update_digest
from fedasync.shared.wire import encode_update, unpack
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def decider(settings: Settings, redis: aioredis.Redis, *, archiving: bool = False) -> Decider:
    keys = Keys(settings.redis.key_prefix)
    cache = KeyCache(redis, keys, settings.auth.key_refresh_s)
    made = Decider(
        settings, AggregatorMetrics(), cache, IngestMarkers(redis, keys), None, archiving=archiving
    )
    made.state = initial_state(settings)
    return made


async def entries_of(redis: aioredis.Redis, keys: Keys) -> list[Entry]:
    entries: Any = await redis.xrange(keys.updates)
    return list(entries)


async def test_a_read_becomes_decisions_and_dead_letters_in_its_batch(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    good = await publish(redis, keys, make_update("u0", base=0))
    garbled = await publish(redis, keys, b"not an update")
    empty: bytes = await redis.xadd(keys.updates, {"x": b"no message"})
    claimed: bytes = await redis.xadd(keys.updates, stream_entry.build_claim("sha256-00"))
    deciding = decider(settings, redis, archiving=True)
    policy = settings.policy.to_policy()
    batch = Batch(b"", 0, b"")

    await deciding.decide_read(await entries_of(redis, keys), batch, policy, None)

    assert batch.acks == [good, garbled, empty, claimed]  # every entry is acknowledged
    [entry] = batch.ledger
    record = unpack(entry.record, 1 << 20)
    assert (record["update_id"], record["outcome"], record["stream_id"]) == (
        "u0",
        "applied",
        good.decode(),
    )
    assert entry.receipt == update_digest("c0", "u0")
    assert [stream_id for stream_id, _ in batch.archive] == [good]
    assert [(d.stream_id, d.reason) for d in batch.dead] == [
        (garbled, "malformed"),
        (empty, "missing_payload"),
        (claimed, "claim_missing"),  # no claim-check store: missing, not a crash
    ]
    assert deciding.state.version == 1
    assert deciding.state.closed is None


async def test_the_state_is_closed_once_its_budget_is_spent(
    settings: Settings, redis: aioredis.Redis
) -> None:
    settings = settings.model_copy(
        update={"budget": settings.budget.model_copy(update={"max_updates": 2})}
    )
    keys = Keys(settings.redis.key_prefix)
    for i in range(3):
        await publish(redis, keys, make_update(f"b{i}", base=i))
    deciding = decider(settings, redis)
    policy = settings.policy.to_policy()
    batch = Batch(b"", 0, b"")

    await deciding.decide_read(await entries_of(redis, keys), batch, policy, None)

    assert deciding.state.closed == "max_updates"
    outcomes = [unpack(e.record, 1 << 20)["outcome"] for e in batch.ledger]
    assert outcomes[:2] == ["applied", "applied"]
    assert outcomes[2] != "applied"  # decided after the close: not applied


async def test_the_state_is_closed_once_its_time_is_spent(
    settings: Settings, redis: aioredis.Redis
) -> None:
    deciding = decider(settings, redis)
    policy = settings.policy.to_policy()

    deciding.close_if_out_of_time(policy, started_at=time.time() + 3600)  # not begun, even
    assert deciding.state.closed is None
    deciding.close_if_out_of_time(policy, started_at=0.0)  # started in 1970: long spent
    assert deciding.state.closed == "max_seconds"


async def test_after_a_rotation_only_an_entry_its_ingest_marker_names_is_taken(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """An entry signed with a key rotated since is taken only when ingest's marker names this
    entry and this body (services/stores/ingest_markers.py): not one written straight to the
    stream under the old key, not another body under the same update id, not a revoked key's."""
    settings = settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"required": True, "window_s": 300.0})}
    )
    keys = Keys(settings.redis.key_prefix)
    store = IngestStore(redis, keys, 3600, window_ms=settings.auth.window_ms)
    seconds, micros = await redis.time()
    at = int(seconds) * 1000 + int(micros) // 1000
    old = parse_key(await add_device(redis, keys, "c0", HMAC))
    gone = parse_key(await add_device(redis, keys, "c1", HMAC))

    def signed(update_id: str, value: float, client: str = "c0") -> tuple[bytes, Proof]:
        raw = encode_update(make_update(update_id, 0, value, client=client))
        return raw, sign(old if client == "c0" else gone, client, at, raw)

    raw, proof = signed("through-ingest", 1.0)
    known = KeyCache(redis, keys, 60.0)
    key = (await known.get_known("c0")).fingerprint
    taken = (await store.add("c0", "through-ingest", raw, proof, key)).entry_id.encode()
    raw, proof = signed("straight", 2.0)
    straight: bytes = await redis.xadd(keys.updates, stream_entry.build(raw, proof))  # type: ignore[arg-type]
    raw, proof = signed("through-ingest", 3.0)  # the same update id, another body
    other: bytes = await redis.xadd(keys.updates, stream_entry.build(raw, proof))  # type: ignore[arg-type]
    raw, proof = signed("revoked", 4.0, client="c1")
    key = (await known.get_known("c1")).fingerprint
    revoked = (await store.add("c1", "revoked", raw, proof, key)).entry_id.encode()
    await add_device(redis, keys, "c0", ED25519)  # rotated: the HMAC key is no longer c0's
    await revoke_device(redis, keys, "c1")
    deciding = decider(settings, redis)
    batch = Batch(b"", 0, b"")

    await deciding.decide_read(
        await entries_of(redis, keys), batch, settings.policy.to_policy(), None
    )

    [entry] = batch.ledger
    record = unpack(entry.record, 1 << 20)
    assert (record["stream_id"], record["outcome"]) == (taken.decode(), "applied")
    assert [(d.stream_id, d.reason) for d in batch.dead] == [
        (straight, "bad_signature"),
        (other, "bad_signature"),
        (revoked, "revoked"),
    ]
