"""The largest body the ingest service reads: an update of the run's model has a known size.

`FEDASYNC_INGEST__MAX_BODY_BYTES`, when set, is the limit. Unset, the limit is the largest valid
update of the run's model (shared/update_size.py): its number of parameters comes from the
layout of the newest committed model, read from the first bytes of the snapshot message with
GETRANGE (the layout comes before the weights, which are never fetched). A run's layout is its
task's, which every process of the run shares (services/stores/run_record.py), so it does not
change while ingest runs; it is looked at again every `REFRESH_S` all the same (a run started
anew under the same prefix). Before the aggregator has committed a model, no device can have
trained from one; the limit is then the wire's cap, `FEDASYNC_WIRE__MAX_MESSAGE_BYTES`, and the
unverified-bytes budget (services/ingest/budget.py) bounds what that can cost.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.runtime.settings import Settings
from fedasync.shared.keys import Keys
from fedasync.shared.layout import LayoutError
from fedasync.shared.update_size import layout_in_head, max_update_bytes

log = logging.getLogger(__name__)

#: seconds between two looks at the run's model (the first look is at the first request)
REFRESH_S = 5.0
#: bytes of a model message read at first to find its layout (more if its layout is longer)
HEAD_BYTES = 64 * 1024


class BodyLimit:
    """The body limit in force: the setting, else the run's model's largest update."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, keys: Keys | None = None) -> None:
        self._redis = redis
        #: the run whose model sets the limit (each run's Ingest has its own BodyLimit)
        self._keys = Keys(settings.redis.key_prefix) if keys is None else keys
        self._explicit = settings.ingest.max_body_bytes
        self._ceiling = settings.wire.max_message_bytes
        self._derived: int | None = None
        self._next_look = 0.0
        self._problem = ""

    @property
    def ceiling(self) -> int:
        """The largest limit this can ever answer."""
        return self._explicit if self._explicit is not None else self._ceiling

    async def get(self, now: float) -> int:
        """The limit, bytes; `now` is the monotonic clock (when to look at the model again)."""
        if self._explicit is not None:
            return self._explicit
        if now >= self._next_look:
            self._next_look = now + REFRESH_S  # set first: concurrent requests do not look too
            try:
                parameters = await self._parameters()
            except TRANSIENT:
                parameters = None  # Redis away: the request's own key look-up will say so
            except ResponseError as exc:  # NOPERM: a Redis user without the ingest user's rights
                self._complain(f"the run's model cannot be read ({exc})")
                parameters = None
            if parameters is not None:
                self._derived = min(max_update_bytes(parameters), self._ceiling)
        return self._ceiling if self._derived is None else self._derived

    async def _parameters(self) -> int | None:
        """Parameters of the newest committed model; None if there is none (yet)."""
        raw: Any = await self._redis.get(self._keys.version)
        if raw is None:
            return None
        key = self._keys.model(int(raw))
        size = HEAD_BYTES
        while True:
            head: Any = await self._redis.getrange(key, 0, size - 1)
            if not head:
                return None  # trimmed since: the next look finds a newer one
            try:
                layout = layout_in_head(bytes(head), whole=len(head) < size)
            except LayoutError as exc:
                self._complain(f"the model {key} has no readable layout ({exc})")
                return None
            if layout is not None:
                return layout.size
            size *= 4

    def _complain(self, problem: str) -> None:
        """One log line per distinct problem, not one per look."""
        if problem != self._problem:
            self._problem = problem
            limit = self._ceiling if self._derived is None else self._derived
            log.error("%s: the body limit stays %d bytes", problem, limit)
