"""The aggregator's commit pipeline against a real Redis: a batch sealed as the state is at that
moment, commits in order with one in flight, and a commit that finds Redis moved refused."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.commit import Batch, Committer
from fedasync.services.aggregator.http import Readiness
from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.memory_pressure import MemoryPressure
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.pipeline import CommitPipeline
from fedasync.services.aggregator.refusal import Refusal
from fedasync.services.aggregator.stream_gauges import StreamGauges
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def pipeline_of(
    settings: Settings, redis: aioredis.Redis, metrics: AggregatorMetrics, ready: Readiness
) -> CommitPipeline:
    keys = Keys(settings.redis.key_prefix)
    return CommitPipeline(
        redis,
        keys,
        settings,
        metrics=metrics,
        memory=MemoryPressure(redis, keys, metrics),
        refusal=Refusal(redis, keys, metrics, ready),
        gauges=StreamGauges(redis, keys, metrics),
        archive=None,
    )


async def test_a_batch_carries_a_model_only_for_a_new_version_and_a_close_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    pipeline = pipeline_of(settings, redis, AggregatorMetrics(), Readiness())
    state = initial_state(settings)

    first, second, third = (Batch(b"", 0, b"") for _ in range(3))
    pipeline.seal(first, state)
    pipeline.seal(second, state)
    assert (first.version, bool(first.model), bool(first.state)) == (0, True, True)
    assert (second.version, second.model) == (0, b"")  # the version did not change
    assert not pipeline.newly_closed(state)

    state.close("max_updates")
    assert pipeline.newly_closed(state)
    pipeline.seal(third, state)
    assert third.done_reason == "max_updates"
    assert not pipeline.newly_closed(state)  # its close is in the batch sealed


async def test_a_start_retried_after_its_genesis_commit_failed_seals_the_model_again(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    pipeline = pipeline_of(settings, redis, AggregatorMetrics(), Readiness())
    state = initial_state(settings)
    committer = Committer(redis, keys, 1, 0, settings.aggregator.keep_versions)

    pipeline.begin(committer)
    lost = Batch(b"", 0, b"")
    pipeline.seal(lost, state)  # the first attempt's genesis, sealed; its commit never lands
    assert lost.model
    pipeline.begin(committer)  # the start is retried as a whole
    genesis = Batch(b"", 0, b"")
    pipeline.seal(genesis, state)
    assert (genesis.version, bool(genesis.model)) == (0, True)  # version 0 with its model


async def test_commits_land_in_order_with_one_in_flight(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics = AggregatorMetrics()
    pipeline = pipeline_of(settings, redis, metrics, Readiness())
    epoch = int(await redis.incr(keys.epoch))
    pipeline.begin(Committer(redis, keys, epoch, 0, settings.aggregator.keep_versions))
    await redis.xgroup_create(keys.updates, AGGREGATOR_GROUP, id="0", mkstream=True)
    published = [await publish(redis, keys, make_update(f"p{i}", base=0)) for i in range(2)]
    consumer = settings.aggregator.consumer
    await redis.xreadgroup(AGGREGATOR_GROUP, consumer, {keys.updates: ">"}, count=2)
    state = initial_state(settings)

    await pipeline.commit(Batch(b"", 0, b""), state)  # the genesis commit, awaited
    for entry_id in published:
        batch = Batch(b"", state.version, b"", acks=[entry_id])
        await pipeline.submit(batch, state)  # after the one in flight landed
        assert pipeline.inflight_acks == {entry_id}
    await pipeline.finish()

    assert pipeline.inflight_acks == frozenset()
    assert pipeline.committer.seq == 3
    assert metrics.registry.get_sample_value("fedasync_aggregator_commits_total") == 3
    pending: Any = await redis.xpending(keys.updates, AGGREGATOR_GROUP)
    assert pending["pending"] == 0


async def test_a_commit_that_finds_the_sequence_moved_is_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    ready = Readiness(ready=True)
    pipeline = pipeline_of(settings, redis, AggregatorMetrics(), ready)
    epoch = int(await redis.incr(keys.epoch))
    # as if commit 5 had been seen: Redis holds none, it moved back under us
    pipeline.begin(Committer(redis, keys, epoch, 5, settings.aggregator.keep_versions))
    state = initial_state(settings)

    await pipeline.submit(Batch(b"", 0, b""), state)
    with pytest.raises(StateMismatch):
        await pipeline.finish()  # the commit in flight's refusal surfaces here
    assert not ready.ready
    assert ready.refused is not None
