"""The aggregator's refusal against a real Redis: said in the log, the metric, an alert and
/readyz's record, then the run stops with `StateMismatch`."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.http import Readiness
from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.refusal import Refusal
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.alerts import STATE_MISMATCH
from fedasync.shared.continuity import Check, Mismatch
from fedasync.shared.keys import Keys

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_refusal_says_why_everywhere_and_stops_the_run(
    settings: Settings, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(settings.redis.key_prefix)
    metrics, ready = AggregatorMetrics(), Readiness(ready=True)
    problems = [
        Mismatch(Check.MEMORY_MISSING, "no delta for c0"),
        Mismatch(Check.STARTED_WITHOUT_COMMIT, "started, yet commit 0"),
    ]

    with (
        caplog.at_level(logging.ERROR, logger="fedasync.services.aggregator.service"),
        pytest.raises(StateMismatch) as raised,
    ):
        await Refusal(redis, keys, metrics, ready).refuse(problems)

    assert raised.value.problems == problems
    said = "memory-missing: no delta for c0; started-without-commit: started, yet commit 0"
    assert str(raised.value) == said
    assert (ready.ready, ready.refused) == (False, said)
    sample = metrics.registry.get_sample_value
    for check in Check:
        expected = 1.0 if check in {p.check for p in problems} else 0.0
        assert sample("fedasync_aggregator_state_mismatches_total", {"check": check.value}) == (
            expected
        )
    [record] = caplog.records
    assert record.getMessage().startswith("refusing to decide: the state in Redis does not match")
    assert said in record.getMessage()
    alerts: Any = await redis.xrange(keys.alerts)
    assert [(f[b"rule"].decode(), f[b"message"].decode()) for _, f in alerts] == [
        (STATE_MISMATCH, f"refusing to decide: {said}")
    ]
