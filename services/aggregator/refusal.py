"""The aggregator's refusal to decide: what it does once Redis is found to have lost writes.

A state that does not match its ledger, consumer group or last commit (found at start,
services/aggregator/inspection.py, or by a commit that finds the sequence moved under it) is
never decided from: carrying on would silently start over. The refusal is said everywhere an
operator looks (log, metric, alert, /readyz) and ends the run with `StateMismatch`.
"""

from __future__ import annotations

import time
from typing import NoReturn

import redis.asyncio as aioredis

from fedasync.services.aggregator.http import Readiness
from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.stores.alerts import STATE_MISMATCH, try_add_alert
from fedasync.shared.continuity import Mismatch
from fedasync.shared.keys import Keys


class Refusal:
    """Says why the aggregator decides nothing more, then stops it."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, metrics: AggregatorMetrics, ready: Readiness
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._metrics = metrics
        self._ready = ready

    async def refuse(self, problems: list[Mismatch]) -> NoReturn:
        """Redis lost writes: say so (log, metric, alert, /readyz) and decide nothing more."""
        for problem in problems:
            self._metrics.state_mismatches.labels(problem.check.value).inc()
        message = "; ".join(str(p) for p in problems)
        log.error(
            "refusing to decide: the state in Redis does not match its ledger, consumer group or "
            "the last commit (Redis lost writes?): %s. See docs/operations.md, "
            '"Redis moved back in time"',
            message,
        )
        self._ready.ready, self._ready.refused = False, message
        await try_add_alert(
            self._redis, self._keys, STATE_MISMATCH, f"refusing to decide: {message}", time.time()
        )
        raise StateMismatch(problems)
