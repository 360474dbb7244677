"""τ_max from latency, as the write-up advises (section 4.2).

An update's τ is the number of updates applied while its device trained, so a device that
takes L seconds sees τ ≈ r·L at update rate r. The slowest devices' τ is about r × P95 of the
fleet's latency; start τ_max there and back off 20–30% (never above the core's limit,
TAU_MAX_LIMIT). Any device whose runs almost never
finish within τ_max / r seconds is, in effect, never heard: its data leaves the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fedasync.shared.fleet import RunLatency
from fedasync.shared.params import TAU_MAX_LIMIT

#: a device counts as permanently dropped when at least this share of its runs is too slow
PERMANENT = 0.95


@dataclass(frozen=True, slots=True)
class Advice:
    rate_per_s: float
    quantile: float
    #: latency of the fleet's slowest devices: the `quantile` of all devices' runs, seconds
    slow_latency_s: float
    expected_tau_slowest: float
    backoff: float
    recommended_tau_max: int
    #: recommendations for a 20% and a 30% back-off
    recommended_range: tuple[int, int]
    tau_max: int
    #: runs longer than this many seconds are dropped at `tau_max`
    cutoff_s: float
    #: devices (indices) whose runs exceed the cutoff at least 95% of the time
    permanently_dropped: tuple[int, ...]
    permanently_dropped_share: float
    #: expected share of all submitted updates that `tau_max` drops
    dropped_update_share: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["recommended_range"] = list(self.recommended_range)
        out["permanently_dropped"] = list(self.permanently_dropped)
        return out


def fleet_quantile(latencies: Sequence[RunLatency], q: float) -> float:
    """The q-quantile of a run's latency on a device chosen uniformly from the fleet."""
    if not latencies:
        raise ValueError("the fleet has no devices")
    low = min(lat.quantile(1e-6) for lat in latencies)
    high = max(lat.quantile(1 - 1e-6) for lat in latencies)
    for _ in range(200):  # bisection on the mixture's CDF; deterministic
        mid = (low + high) / 2
        if sum(lat.cdf(mid) for lat in latencies) / len(latencies) >= q:
            high = mid
        else:
            low = mid
    return high


def estimated_rate(
    latencies: Sequence[RunLatency],
    max_concurrency: int | None = None,
    online_share: float = 1.0,
) -> float:
    """Updates per second if every device trains back to back: Σ 1/E[L], capped by concurrency.

    With a cap of c devices training at once (and a queue that serves devices in turn), the
    rate is about c / mean(E[L]).
    """
    free = sum(1.0 / lat.mean() for lat in latencies) * online_share
    if max_concurrency is None or max_concurrency >= len(latencies):
        return free
    mean_latency = sum(lat.mean() for lat in latencies) / len(latencies)
    return min(free, max_concurrency / mean_latency)


def advise(
    latencies: Sequence[RunLatency],
    rate_per_s: float,
    tau_max: int | None = None,
    *,
    backoff: float = 0.25,
    quantile: float = 0.95,
) -> Advice:
    """Recommend τ_max for this fleet and rate, and say who is cut off at `tau_max`."""
    if not rate_per_s > 0:
        raise ValueError(f"the update rate must be > 0, got {rate_per_s}")
    if not 0 <= backoff < 1 or not 0 < quantile < 1:
        raise ValueError("backoff must be in [0, 1) and quantile in (0, 1)")
    slow = fleet_quantile(latencies, quantile)
    expected = rate_per_s * slow

    def backed_off(share: float) -> int:
        return min(TAU_MAX_LIMIT, max(0, math.floor(expected * (1 - share))))

    recommended = backed_off(backoff)
    evaluated = recommended if tau_max is None else tau_max
    cutoff = evaluated / rate_per_s  # τ ≈ r·L > τ_max  ⇔  L > τ_max / r
    too_slow = [1.0 - lat.cdf(cutoff) for lat in latencies]
    dropped = tuple(d for d, share in enumerate(too_slow) if share >= PERMANENT)
    weights = [1.0 / lat.mean() for lat in latencies]  # fast devices submit more often
    dropped_updates = sum(w * s for w, s in zip(weights, too_slow, strict=True)) / sum(weights)
    return Advice(
        rate_per_s=rate_per_s,
        quantile=quantile,
        slow_latency_s=slow,
        expected_tau_slowest=expected,
        backoff=backoff,
        recommended_tau_max=recommended,
        recommended_range=(backed_off(0.3), backed_off(0.2)),
        tau_max=evaluated,
        cutoff_s=cutoff,
        permanently_dropped=dropped,
        permanently_dropped_share=len(dropped) / len(latencies),
        dropped_update_share=dropped_updates,
    )
