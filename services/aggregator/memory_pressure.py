"""Redis refusing the aggregator's writes for want of memory: counted, alerted, and its end said.

An out-of-memory refusal wrote nothing, so the write is retried (services/runtime/redis_conn.py)
and deciding waits, losing nothing. Operators hear of it twice: an alert when it begins (at most
one a minute while it lasts: the alert is itself a write, and lands once memory is freed), and a
log line and an alert saying how long it lasted once a write passes again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis.asyncio as aioredis

from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.stores.alerts import REDIS_OOM, try_add_alert
from fedasync.shared.keys import Keys

#: at most one out-of-memory alert per this many seconds while Redis refuses commits
OOM_ALERT_INTERVAL_S = 60.0


class MemoryPressure:
    """Whether Redis is refusing the aggregator's writes for want of memory, and since when."""

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
        self._alerted_at = -OOM_ALERT_INTERVAL_S
        #: when Redis began refusing our writes for want of memory (None: it takes them)
        self.since: float | None = None

    async def refused(self, exc: BaseException) -> None:
        """Redis refused a write for want of memory (it is retried): count it, and alert at
        most once a minute (the alert itself is a write; it lands once memory is freed)."""
        self._metrics.redis_oom.inc()
        now = self._clock()
        if self.since is None:
            self.since = now
        if now - self._alerted_at < OOM_ALERT_INTERVAL_S:
            return
        self._alerted_at = now
        message = (
            f"Redis refused a write of the aggregator for want of memory ({exc}); retrying: "
            'free memory or raise maxmemory (docs/operations.md, "Redis memory")'
        )
        await try_add_alert(self._redis, self._keys, REDIS_OOM, message, time.time())

    async def passed(self) -> None:
        """A write passed after out-of-memory refusals: say for how long they lasted."""
        if self.since is None:
            return
        lasted, self.since = self._clock() - self.since, None
        message = (
            f"Redis refused the aggregator's writes for want of memory for {lasted:.0f} s; "
            "they pass again and deciding goes on (nothing was lost)"
        )
        log.warning("%s", message)
        await try_add_alert(self._redis, self._keys, REDIS_OOM, message, time.time())
