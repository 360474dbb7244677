"""The recent decisions, read incrementally from the ledger: what status and the rules see."""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from fedasync.services.control.privacy import Spent
from fedasync.services.stores import ledger
from fedasync.shared.acceptance import acceptance_rows, closing_drop
from fedasync.shared.keys import Keys
from fedasync.shared.rules import DecisionWindow, Figures
from fedasync.shared.stats import AppliedRate, percentiles


class LedgerWindow:
    """A `DecisionWindow` fed from the ledger stream, read incrementally."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, window_s: float, per_client: int):
        self.redis = redis
        self.keys = keys
        self.window = DecisionWindow(window_s, per_client)
        self._cursor = "0-0"
        self._lock = asyncio.Lock()
        #: decisions since training started, by outcome (the ledger is read from its start)
        self.totals: Counter[str] = Counter()
        #: applied per second since the first applied update (the run summary's definition)
        self.applied_rate = AppliedRate()
        #: ε after the newest decision that carried it (differential privacy)
        self.spent = Spent()

    async def refresh(self, now: float) -> None:
        """Take in what was committed since the last refresh; forget what left the window."""
        async with self._lock:
            async for r in ledger.records(self.redis, self.keys, after=self._cursor):
                self._cursor = r["ledger_id"]
                self.totals[r["outcome"]] += 1
                self.applied_rate.add(float(r["at"]), r["outcome"])
                carried = Spent.in_record(r)
                if carried is not None:
                    self.spent = carried
                if not closing_drop(r):  # after the budget: says nothing about the fleet
                    self.window.add(
                        float(r["at"]), r["outcome"], r["client_id"], r["tau"], r["alpha"]
                    )
            self.window.expire(now)

    def figures(self, now: float, lag: float, memory_share: float = 0.0) -> Figures:
        return self.window.figures(now, lag, memory_share)

    def summary(self) -> dict[str, Any]:
        w = self.window
        taus = [tau for _, _, tau, _ in w.recent if tau is not None]
        alphas = [a for _, outcome, _, a in w.recent if a is not None and outcome == "applied"]
        return {
            "window_s": w.window_s,
            "totals": dict(self.totals),
            "update_rate": w.update_rate,
            "applied_per_second": self.applied_rate.per_second,
            "drop_share": w.drop_share,
            "consecutive_drops": w.consecutive_drops,
            "tau": percentiles(taus),
            "alpha": percentiles(alphas),
            "tau_histogram": _tau_histogram(taus),
            "alpha_histogram": _alpha_histogram(alphas),
            "clients": acceptance_rows(w.acceptance()),
        }


#: τ values shown one bar each; larger ones share the last bar
TAU_BARS = 30
ALPHA_BINS = 10


def _tau_histogram(taus: list[int]) -> dict[str, list[Any]]:
    """Decisions per τ (0 … TAU_BARS − 1, then one bar for everything above)."""
    counts = [0] * (TAU_BARS + 1)
    for tau in taus:
        counts[min(max(int(tau), 0), TAU_BARS)] += 1
    labels = [str(t) for t in range(TAU_BARS)] + [f"≥{TAU_BARS}"]
    return {"labels": labels, "counts": counts}


def _alpha_histogram(alphas: list[float]) -> dict[str, list[Any]]:
    """Applied updates per α bin of width 0.1 over [0, 1]."""
    counts, edges = np.histogram(np.asarray(alphas, dtype=np.float64), ALPHA_BINS, (0.0, 1.0))
    labels = [f"{edges[i]:.1f}–{edges[i + 1]:.1f}" for i in range(ALPHA_BINS)]
    return {"labels": labels, "counts": [int(c) for c in counts]}


class RunWindows:
    """A LedgerWindow per run, made on first use: the default run's is the service's own (what
    the rules runner and the legacy routes read), each other run's is read from its own ledger.

    Bounded: past `capacity` runs the least recently used window is forgotten, and made again
    (reading that run's ledger from its start) when it is next asked for."""

    def __init__(
        self,
        default: LedgerWindow,
        default_run: str,
        window_s: float,
        per_client: int,
        capacity: int = 256,
    ) -> None:
        self.default = default
        self.default_run = default_run
        self._window_s, self._per_client, self._capacity = window_s, per_client, capacity
        self._own: OrderedDict[str, LedgerWindow] = OrderedDict()

    def of(self, run: str, redis: aioredis.Redis) -> LedgerWindow:
        """The window of `run`, whose keys `redis` serves."""
        if run == self.default_run:
            return self.default
        window = self._own.get(run)
        if window is None:
            window = LedgerWindow(redis, Keys(run), self._window_s, self._per_client)
            self._own[run] = window
        self._own.move_to_end(run)
        while len(self._own) > self._capacity:
            self._own.popitem(last=False)
        return window
