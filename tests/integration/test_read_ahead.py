"""The read-ahead against a real Redis: the next read is on its way before a read is decided.

A small read is decided synchronously on the event loop; a read-ahead task only created before
that would not even write its command until the deciding is done, and Redis would sit idle
while we decide, then we would wait while Redis serves (docs/architecture.md, "The ceiling").
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.deciding import Decider
from fedasync.services.aggregator.service import run
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def awaited_chain(coro: Coroutine[Any, Any, Any]) -> list[str]:
    """The names of the coroutines `coro` is suspended in, outermost first."""
    names: list[str] = []
    current: Any = coro
    while current is not None and hasattr(current, "cr_code"):
        names.append(current.cr_code.co_name)
        current = current.cr_await
    return names


async def test_the_read_ahead_waits_for_its_reply_while_a_read_is_decided(
    settings: Settings, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings.model_copy(
        update={"aggregator": settings.aggregator.model_copy(update={"read_count": 2})}
    )
    keys = Keys(settings.redis.key_prefix)
    await run(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    for i in range(8):
        await publish(redis, keys, make_update(f"a{i}", base=0))

    seen: list[list[str]] = []
    decide_all = Decider.decide_all

    def watching(self: Decider, entries: Any, batch: Any, policy: Any) -> None:
        # the read-ahead on its way, if any (the reader's task of that name)
        ahead = [t for t in asyncio.all_tasks() if t.get_name() == "read-ahead"]
        if entries:  # (the start's re-read of our own pending entries finds none)
            seen.append(awaited_chain(ahead[0].get_coro()) if ahead else [])
        decide_all(self, entries, batch, policy)

    monkeypatch.setattr(Decider, "decide_all", watching)
    await run(settings, redis=redis, handle_signals=False, burst=True)

    # reads of 2: the first three each had a read-ahead sent, its command already written and
    # its reply awaited, when their deciding began (the fourth was the last: nothing after it
    # filled a read, so the read-ahead found nothing, or none was needed)
    assert len(seen) == 4
    for chain in seen[:3]:
        assert "read_response" in chain, " > ".join(chain)
    entries = await ledger(redis, keys)
    assert [e["update_id"] for e in entries] == [f"a{i}" for i in range(8)]
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0
    report = await verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
