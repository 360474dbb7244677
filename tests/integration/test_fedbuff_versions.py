"""FedBuff through the aggregator: one version per server step, exact ledger, budget, restarts."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.exactly_once import Decided, check
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.policy import Mode, ServerOptimizer
from fedasync.shared.update import Update
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

K = 3


def fedbuff(settings: Settings, max_updates: int = 1000) -> Settings:
    policy = settings.policy.model_copy(
        update={
            "mode": Mode.FEDBUFF,
            "buffer_size": K,
            "server_optimizer": ServerOptimizer.ADAM,
            "server_lr": 0.05,
        }
    )
    budget = settings.budget.model_copy(update={"max_updates": max_updates})
    return settings.model_copy(update={"policy": policy, "budget": budget})


def script() -> list[Update]:
    """Eight updates: each trained from the version in force two updates earlier."""
    bases = [0, 0, 0, 1, 1, 1, 2, 2]
    return [make_update(f"u{i}", base=b, value=float(i % 4)) for i, b in enumerate(bases)]


async def test_versions_count_server_steps_and_the_ledger_replays_exactly(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys, config = Keys(settings.redis.key_prefix), fedbuff(settings, max_updates=7)
    expected = initial_state(settings)
    policy = config.policy.to_policy()
    updates = script()
    for update in updates[:4]:  # a restart in the middle of the second buffer
        await publish(redis, keys, update)
    first = await run(
        config, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert first.version == 1
    for update in updates[4:]:
        await publish(redis, keys, update)
    result = await run(config, redis=redis, handle_signals=False, burst=True)
    for update in updates[:7]:
        expected.apply(update, policy)

    # the 7th applied update reaches the budget of applied updates, not of versions
    assert (result.version, result.closed) == (2, "max_updates")
    entries = await ledger(redis, keys)
    assert [e["outcome"] for e in entries] == ["applied"] * 7 + ["dropped"]
    assert [e["version"] for e in entries] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert [e["tau"] for e in entries[:7]] == [0, 0, 0, 0, 0, 0, 0]
    assert [e["server_step"] for e in entries[:7]] == [False, False, True] * 2 + [False]
    # one snapshot per version, each the model of that server step
    for version in (0, 1, 2):
        assert await get_bytes(redis, keys.model(version)) is not None
    assert await get_bytes(redis, keys.model(3)) is None
    raw = await get_bytes(redis, keys.model(2))
    assert raw is not None
    assert decode_model(raw).snapshot.weights.tobytes() == expected.weights_view().tobytes()
    ids = {u.update_id for u in updates}
    verdict = check(ids, ids, [Decided.from_record(e) for e in entries])
    assert verdict.ok
    assert verdict.version_gaps == []
    assert (verdict.first_version, verdict.last_version) == (1, 2)
    report = await verify(redis, keys, config.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_a_stale_fedbuff_update_is_measured_in_server_steps(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    policy = settings.policy.model_copy(
        update={"mode": Mode.FEDBUFF, "buffer_size": K, "tau_max": 1}
    )
    config = settings.model_copy(update={"policy": policy})
    for i in range(2 * K):  # two server steps of fresh updates
        await publish(redis, keys, make_update(f"f{i}", base=i // K))
    await publish(redis, keys, make_update("two-behind", base=0))
    await publish(redis, keys, make_update("one-behind", base=1))
    await run(
        config, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    entries: list[dict[str, Any]] = await ledger(redis, keys)
    last = {e["update_id"]: (e["outcome"], e["tau"]) for e in entries[-2:]}
    assert last == {"two-behind": ("dropped", 2), "one-behind": ("applied", 1)}
    assert (await verify(redis, keys, config.wire.max_message_bytes)).ok
