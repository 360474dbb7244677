"""The runs one snapshot service serves: a model cache per run, made on the first request.

The default run (the deployment's key prefix: the legacy routes) is held from the start; any
other run once a request names it (the runs middleware has checked that it exists). Each run
has its own cache, figures, Redis client (runtime/run_clients.py: its own on a cluster) and
lock: one refresh of a run at a time, so two reads of its version can never interleave and
look like Redis moving back in time.

At most `snapshot.max_runs` runs are held; a request for one more is refused (503
`too_many_runs`, counted), never served by evicting another: a held run has followers and
long-polls of its own, and an eviction would silently drop them. A run stays held until the
service restarts (runs are few and long-lived; a retired run costs its cache until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.settings import SnapshotSettings
from fedasync.services.snapshot.cache import ModelCache
from fedasync.services.snapshot.metrics import RunMetrics, SnapshotMetrics
from fedasync.shared.keys import Keys

#: the wire reason of a run refused because the service holds as many as it may
TOO_MANY_RUNS = "too_many_runs"


@dataclass(eq=False, slots=True)
class ServedRun:
    """One run as this service holds it."""

    id: str
    keys: Keys
    redis: aioredis.Redis
    cache: ModelCache
    metrics: RunMetrics
    #: one refresh at a time (see the module's docstring)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: set once its first load was tried (app.py: a request waits for it, not a 503)
    loaded: asyncio.Event = field(default_factory=asyncio.Event)


class TooManyRuns(RuntimeError):
    """The service holds `snapshot.max_runs` runs already."""

    reason = TOO_MANY_RUNS


class RunCaches:
    """Every run held, by id; `added` is set when one is added (the follower subscribes)."""

    def __init__(
        self, clients: RunClients, settings: SnapshotSettings, metrics: SnapshotMetrics
    ) -> None:
        self._clients = clients
        self._settings = settings
        self._metrics = metrics
        self._runs: dict[str, ServedRun] = {}
        self.added = asyncio.Event()
        self.closing = False
        #: the default run, held from the start
        self.default = self._add(clients.default)

    def get(self, run: str) -> ServedRun | None:
        """`run` if it is held (never adds one: the fast path asks this)."""
        return self._runs.get(run)

    def open(self, run: str) -> tuple[ServedRun, bool]:
        """`run`, added if it is not held yet (and whether it was just added); TooManyRuns once
        `max_runs` are held."""
        served = self._runs.get(run)
        if served is not None:
            return served, False
        if len(self._runs) >= self._settings.max_runs:
            self._metrics.runs_refused.inc()
            raise TooManyRuns(
                f"this service holds {len(self._runs)} runs, its most "
                "(FEDASYNC_SNAPSHOT__MAX_RUNS); retry later or raise the setting"
            )
        served = self._add(run)
        self.added.set()
        return served, True

    def _add(self, run: str) -> ServedRun:
        cache = ModelCache(self._settings.cache_versions, self._settings.max_waiters)
        metrics = self._metrics.run(run)
        metrics.waiters.set_function(lambda: cache.waiters)
        served = ServedRun(run, Keys(run), self._clients.for_run(run), cache, metrics)
        self._runs[run] = served
        return served

    def __iter__(self) -> Iterator[ServedRun]:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)

    async def close(self) -> None:
        """Shutdown: every run's long-polls return at once, and no run is added any more."""
        self.closing = True
        self.added.set()
        for served in self:
            await served.cache.close()
