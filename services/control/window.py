"""The recent decisions, read incrementally from the ledger: what status and the rules see."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import redis.asyncio as aioredis

from services.keys import Keys


@dataclass(frozen=True, slots=True)
class Seen:
    at: float
    outcome: str
    tau: int | None
    alpha: float | None


class LedgerWindow:
    """Decisions of the last `window_s` seconds, and each client's last `per_client` outcomes."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, window_s: float, per_client: int):
        self.redis = redis
        self.keys = keys
        self.window_s = window_s
        self.per_client = per_client
        self.recent: deque[Seen] = deque()
        self.clients: dict[str, deque[bool]] = {}
        self.consecutive_drops = 0
        self._cursor = "0-0"
        self._lock = asyncio.Lock()

    async def refresh(self, now: float) -> None:
        """Take in what was committed since the last refresh; forget what left the window."""
        async with self._lock:
            while True:
                entries: Any = await self.redis.xrange(
                    self.keys.ledger, min="(" + self._cursor, max="+", count=1000
                )
                for entry_id, fields in entries:
                    self._cursor = entry_id.decode()
                    self._take(msgpack.unpackb(fields[b"d"], raw=False))
                if len(entries) < 1000:
                    break
            while self.recent and self.recent[0].at < now - self.window_s:
                self.recent.popleft()

    def _take(self, record: dict[str, Any]) -> None:
        outcome = record["outcome"]
        if outcome == "duplicate":
            return
        self.recent.append(Seen(float(record["at"]), outcome, record["tau"], record["alpha"]))
        self.consecutive_drops = self.consecutive_drops + 1 if outcome == "dropped" else 0
        history = self.clients.setdefault(record["client_id"], deque(maxlen=self.per_client))
        history.append(outcome == "applied")

    @property
    def update_rate(self) -> float:
        return len(self.recent) / self.window_s

    @property
    def drop_share(self) -> float:
        decided = len(self.recent)
        return sum(s.outcome == "dropped" for s in self.recent) / decided if decided else 0.0

    def acceptance(self) -> dict[str, tuple[int, int]]:
        """(applied, decided) over each client's last decisions."""
        return {client: (sum(h), len(h)) for client, h in self.clients.items()}

    def summary(self) -> dict[str, Any]:
        taus = [s.tau for s in self.recent if s.tau is not None]
        alphas = [s.alpha for s in self.recent if s.alpha is not None and s.outcome == "applied"]
        worst_first = sorted(self.acceptance().items(), key=lambda kv: (kv[1][0] / kv[1][1], kv[0]))
        return {
            "window_s": self.window_s,
            "update_rate": self.update_rate,
            "drop_share": self.drop_share,
            "consecutive_drops": self.consecutive_drops,
            "tau": _percentiles(taus),
            "alpha": _percentiles(alphas),
            "clients": [
                {"client": c, "applied": a, "decided": d, "rate": a / d}
                for c, (a, d) in worst_first
            ],
        }


def _percentiles(values: list[Any]) -> dict[str, float] | None:
    if not values:
        return None
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return {"p50": float(p50), "p95": float(p95), "max": float(max(values))}
