"""No update stranded after fencing: the running aggregator takes over entries left idle.

A second aggregator takes over, at its start, the entries the first had read. Entries the first
reads *after* that takeover, before its next commit is refused, stayed pending under its
consumer with no decision until some aggregator restarted. Here the first is running when the
second starts, reads entries after the takeover and is fenced off at its commit; the second
keeps running (no restart) and must decide them, taken over once idle for `claim_idle_s`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Fenced
from fedasync.services.aggregator.service import Aggregator, run
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import (
    initial_state,
    ledger,
    make_update,
    publish,
    wait_for_ledger,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: generous: an event awaited, never a timing claim
DEADLINE_S = 60.0


def with_aggregator(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(
        update={"aggregator": settings.aggregator.model_copy(update=changes)}
    )


async def pending_ids(redis: aioredis.Redis, keys: Keys) -> dict[str, str]:
    """Entry id → consumer, for every entry pending in the group."""
    pending: Any = await redis.xpending_range(
        keys.updates, AGGREGATOR_GROUP, min="-", max="+", count=1000
    )
    return {p["message_id"].decode(): p["consumer"].decode() for p in pending}


class Gate:
    """Holds an aggregator's reads of new entries (XREADGROUP `>`) while closed: the aggregator
    waits before its next read as a stopped or descheduled one does, and reads when opened."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.opened = asyncio.Event()
        self.opened.set()
        self.parked = asyncio.Event()
        read = client.xreadgroup

        async def gated(*args: Any, **kwargs: Any) -> Any:
            streams = args[2] if len(args) > 2 else kwargs["streams"]
            if ">" in streams.values() and not self.opened.is_set():
                self.parked.set()
                await self.opened.wait()
            return await read(*args, **kwargs)

        client.xreadgroup = gated  # type: ignore[method-assign]

    async def close(self) -> None:
        """Close, and return once the aggregator waits at the gate."""
        self.parked.clear()
        self.opened.clear()
        await asyncio.wait_for(self.parked.wait(), DEADLINE_S)


@pytest.mark.parametrize(
    ("old_name", "new_name"),
    [("aggregator", "aggregator"), ("aggregator-a", "aggregator-b")],
    ids=["same-consumer-name", "other-consumer-names"],
)
async def test_entries_read_by_a_fenced_aggregator_after_the_takeover_are_decided(
    settings: Settings, redis: aioredis.Redis, old_name: str, new_name: str
) -> None:
    keys = Keys(settings.redis.key_prefix)
    # the old one never gets to its next claim (as if stopped or slow): only its commit fences it
    old_settings = with_aggregator(settings, consumer=old_name, claim_interval_s=3600.0)
    new_settings = with_aggregator(
        settings, consumer=new_name, claim_interval_s=0.1, claim_idle_s=0.5
    )
    old_client, new_client = connect(settings.redis), connect(settings.redis)
    old_gate, new_gate = Gate(old_client), Gate(new_client)
    stopping = asyncio.Event()
    try:
        old = Aggregator(old_settings, old_client, keys)
        await old.start(initial_state(settings))
        old_running = asyncio.create_task(old.run(asyncio.Event()))
        await publish(redis, keys, make_update("before", base=0))
        cursor = await wait_for_ledger(redis, keys, "0-0", 1)  # the old one is live
        await old_gate.close()

        new = Aggregator(new_settings, new_client, keys)
        await new.start(None)  # fences the old one off; nothing of its is pending now
        new_running = asyncio.create_task(new.run(stopping))
        await new_gate.close()  # the new one has re-read its backlog and is running
        stranded = [await publish(redis, keys, make_update(f"s{i}", base=1)) for i in range(5)]
        read_at = time.time()
        old_gate.opened.set()  # the old one reads them after the takeover, decides them ...
        with pytest.raises(Fenced):  # ... and its commit is refused
            await asyncio.wait_for(old_running, DEADLINE_S)
        # the fault happened: the entries are pending under the old consumer, undecided
        assert await pending_ids(redis, keys) == {s.decode(): old_name for s in stranded}
        assert [r["update_id"] for r in await ledger(redis, keys)] == ["before"]

        new_gate.opened.set()
        await wait_for_ledger(redis, keys, cursor, 5)  # without the claim: never, until a restart
        stopping.set()
        await new_running
    finally:
        stopping.set()
        await old_client.aclose()
        await new_client.aclose()
    records = await ledger(redis, keys)
    assert [r["update_id"] for r in records] == ["before", *(f"s{i}" for i in range(5))]
    assert [r["outcome"] for r in records] == ["applied"] * 6
    assert new.metrics.registry.get_sample_value("fedasync_aggregator_claimed_total") == 5
    # taken over only once idle for claim_idle_s (Redis checks the idle time at XCLAIM)
    assert min(r["at"] for r in records[1:]) - read_at >= new_settings.aggregator.claim_idle_s
    assert await pending_ids(redis, keys) == {}
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_an_idle_fenced_aggregator_stops_at_its_next_claim(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """With nothing to commit, a fenced aggregator would never hear of it; the claim's epoch
    check stops it, so it reads (and strands) nothing more."""
    keys = Keys(settings.redis.key_prefix)
    old = Aggregator(with_aggregator(settings, claim_interval_s=0.1), redis, keys)
    await old.start(initial_state(settings))
    old_running = asyncio.create_task(old.run(asyncio.Event()))
    await publish(redis, keys, make_update("before", base=0))
    await wait_for_ledger(redis, keys, "0-0", 1)
    await Aggregator(settings, redis, keys).start(None)
    with pytest.raises(Fenced):
        await asyncio.wait_for(old_running, DEADLINE_S)


async def test_without_audit_the_payload_of_an_entry_pending_elsewhere_is_not_trimmed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Trimming up to the last acknowledged entry dropped entries still pending under another
    consumer: taken over later, they had no payload (Redis 7 even drops them from the pending
    list at XCLAIM, so they got no decision at all)."""
    keys = Keys(settings.redis.key_prefix)
    lean = with_aggregator(settings, keep_payloads=False, claim_idle_s=3600.0)
    client = connect(settings.redis)
    gate = Gate(client)
    stopping = asyncio.Event()
    try:
        aggregator = Aggregator(lean, client, keys)
        await aggregator.start(initial_state(settings))
        running = asyncio.create_task(aggregator.run(stopping))
        first = await publish(redis, keys, make_update("first", base=0))
        await wait_for_ledger(redis, keys, "0-0", 1)
        await gate.close()
        held = await publish(redis, keys, make_update("held", base=0))
        await redis.xreadgroup(AGGREGATOR_GROUP, "gone", {keys.updates: ">"}, count=1)
        for i in range(4):
            await publish(redis, keys, make_update(f"t{i}", base=0))
        gate.opened.set()
        await wait_for_ledger(redis, keys, "0-0", 5)
        stopping.set()
        await running  # its last commit, and the trim after it, are done
    finally:
        stopping.set()
        await client.aclose()
    assert [r["update_id"] for r in await ledger(redis, keys)] == [
        "first",
        *(f"t{i}" for i in range(4)),
    ]
    assert not await redis.xrange(keys.updates, min=first, max=first)  # it did trim ...
    kept: Any = await redis.xrange(keys.updates, min=held, max=held)
    assert kept, "... past an entry pending under another consumer"
    await run(lean, redis=redis, handle_signals=False, burst=True)  # takes it over at start
    records = await ledger(redis, keys)
    assert [(r["update_id"], r["outcome"]) for r in records][-1] == ("held", "applied")
    assert await pending_ids(redis, keys) == {}
