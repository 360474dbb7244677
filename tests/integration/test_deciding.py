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
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.ingest_markers import IngestMarkers
from fedasync.shared import stream_entry
from fedasync.shared.keys import Keys, update_digest
from fedasync.shared.wire import unpack
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
