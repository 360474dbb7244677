"""The policy in force, re-read from Redis between batches.

An operator changes the policy (services/stores/policy_store.py) while the aggregator runs; it
takes effect between batches, never inside one, so each decision's policy is a deterministic,
recorded point. The record is re-read at most every POLICY_REFRESH_S: often enough that a pause
or a new α is felt at once, rarely enough to cost nothing beside the reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import redis.asyncio as aioredis

from fedasync.services.aggregator.logger import log
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.redis_conn import retrying
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.policy_store import read_policy
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy

#: how often the policy record is re-read between batches, seconds
POLICY_REFRESH_S = 0.2


class PolicyRefresh:
    """Holds the policy the next batch is decided under, and brings it up to date."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        settings: RedisSettings,
        metrics: AggregatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._read_at = 0.0
        #: the policy in force: the next batch is decided under it (installed at start)
        self.policy: Policy

    async def refresh(self, stopping: asyncio.Event | None) -> None:
        """Policy changes take effect between batches: a deterministic, recorded point."""
        now = self._clock()
        if now - self._read_at < POLICY_REFRESH_S:
            return
        self._read_at = now
        policy = await retrying(
            "GET policy",
            lambda: read_policy(self._redis, self._keys),
            self._settings,
            stopping,
        )
        if policy.version != self.policy.version:
            log.info("policy %d → %d", self.policy.version, policy.version)
            self.policy = policy
            self._metrics.policy_version.set(policy.version)
