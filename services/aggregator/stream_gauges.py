"""The stream's figures the aggregator reports: its length, what is pending, and the lag.

Read after each commit and at rest (so the figures come back to 0 once everything is decided,
instead of staying at the last commit's), at most once a second, and best-effort: a gauge is
never worth stopping the deciding for. Redis 7.0's entries-read counter drifts across restarts
and failovers; the aggregator, the group's one reader, corrects it here before reading the lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis.asyncio as aioredis

from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.redis_conn import best_effort
from fedasync.services.stores.backlog import correct_lag, read_backlog
from fedasync.shared.keys import Keys

#: the gauges are read at most once per this many seconds
GAUGES_INTERVAL_S = 1.0


class StreamGauges:
    """Sets the pending, lag and stream-length gauges from Redis, at most once a second."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        metrics: AggregatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._metrics = metrics
        self._clock = clock
        self._read_at = 0.0

    async def update(self) -> None:
        """Stream length, pending and lag, read at most once a second; best-effort."""
        now = self._clock()
        if now - self._read_at < GAUGES_INTERVAL_S:
            return
        self._read_at = now
        drift = await best_effort("lag correction", lambda: correct_lag(self._redis, self._keys))
        if drift:
            log.warning(
                "Redis reported a lag of %d with every entry read (its entries-read counter "
                "drifts across restarts and failovers on Redis 7.0): corrected",
                drift,
            )
        backlog = await best_effort("stream gauges", lambda: read_backlog(self._redis, self._keys))
        if backlog is None:
            return
        self._metrics.pending.set(backlog.pending)
        self._metrics.lag.set(backlog.lag)
        self._metrics.stream_length.set(backlog.length)
