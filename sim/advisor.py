"""τ_max from latency, as the write-up advises (section 4.2).

An update's τ is the number of updates applied while its device trained, so a device that
takes L seconds sees τ ≈ r·L at update rate r. The slowest devices' τ is about r × P95 of the
fleet's latency; start τ_max there and back off 20–30% (never above the core's limit,
TAU_MAX_LIMIT). Any device whose runs almost never
finish within τ_max / r seconds is, in effect, never heard: its data leaves the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedasync.shared.fleet import DeviceLatency, RunLatency, device_cdfs
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


class Laws:
    """A fleet's latency laws grouped: each distinct law once, and which one each device has.

    A long-tail fleet of a million devices has four distinct laws, so a CDF is evaluated four
    times per question instead of a million. Sums over devices are still taken device by
    device, left to right (`total`), so every figure is bit for bit what a plain loop over
    the devices gives.
    """

    def __init__(self, latencies: Sequence[RunLatency]) -> None:
        if not latencies:
            raise ValueError("the fleet has no devices")
        first: dict[object, int] = {}
        self.distinct: list[RunLatency] = []
        which = np.empty(len(latencies), dtype=np.int64)
        for device, law in enumerate(latencies):
            key = _key(law)
            found = first.get(key)
            if found is None:
                found = first[key] = len(self.distinct)
                self.distinct.append(law)
            which[device] = found
        self.which = which
        #: the distinct laws that are `DeviceLatency` (every profile's), as arrays, so that a
        #: CDF over 100,000 distinct medians is one pass (`cdfs`) rather than 100,000 calls
        self._smooth = np.array([isinstance(law, DeviceLatency) for law in self.distinct])
        lognormal = [law for law in self.distinct if isinstance(law, DeviceLatency)]
        self._medians = np.array([law.median_s for law in lognormal], dtype=np.float64)
        self._jitters = np.array([law.jitter for law in lognormal], dtype=np.float64)
        #: `fleet_quantile`'s answers, by quantile: each is a bisection over the whole fleet
        self.quantiles: dict[float, float] = {}

    def cdfs(self, seconds: float) -> np.ndarray:
        """Each device's `law.cdf(seconds)`, in device order: `per_device` of the CDF, the
        same values, with the `DeviceLatency` laws evaluated together (`device_cdfs`)."""
        values = np.empty(len(self.distinct), dtype=np.float64)
        values[self._smooth] = device_cdfs(self._medians, self._jitters, seconds)
        for i in np.flatnonzero(~self._smooth).tolist():
            values[i] = self.distinct[i].cdf(seconds)
        return values[self.which]

    def __len__(self) -> int:
        return len(self.which)

    def per_device(self, value: Callable[[RunLatency], float]) -> np.ndarray:
        """`value` of each device's law, in device order, evaluated once per distinct law."""
        return np.array([value(law) for law in self.distinct], dtype=np.float64)[self.which]

    def total(self, value: Callable[[RunLatency], float]) -> float:
        """Σ over devices of `value(law)`, added in device order as `sum` would."""
        return _total(self.per_device(value))


def _key(law: RunLatency) -> object:
    """Equal immutable laws group together; a mutable one (a replayed trace) stands alone."""
    try:
        hash(law)
    except TypeError:
        return ("device", id(law))
    return law


def _total(values: np.ndarray) -> float:
    """Left-to-right float sum (cumulative, not numpy's pairwise), as the built-in `sum`."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def fleet_quantile(latencies: Sequence[RunLatency] | Laws, q: float) -> float:
    """The q-quantile of a run's latency on a device chosen uniformly from the fleet."""
    laws = latencies if isinstance(latencies, Laws) else Laws(latencies)
    known = laws.quantiles.get(q)
    if known is not None:
        return known
    low = min(law.quantile(1e-6) for law in laws.distinct)
    high = max(law.quantile(1 - 1e-6) for law in laws.distinct)
    for _ in range(200):  # bisection on the mixture's CDF; deterministic
        mid = (low + high) / 2
        settled = mid in (low, high)  # adjacent floats: after this step nothing moves again
        if _total(laws.cdfs(mid)) / len(laws) >= q:
            high = mid
        else:
            low = mid
        if settled:
            break  # the remaining steps would repeat this one's mid and leave high as it is
    laws.quantiles[q] = high
    return high


def estimated_rate(
    latencies: Sequence[RunLatency] | Laws,
    max_concurrency: int | None = None,
    online_share: float = 1.0,
) -> float:
    """Updates per second if every device trains back to back: Σ 1/E[L], capped by concurrency.

    With a cap of c devices training at once (and a queue that serves devices in turn), the
    rate is about c / mean(E[L]).
    """
    laws = latencies if isinstance(latencies, Laws) else Laws(latencies)
    free = laws.total(lambda law: 1.0 / law.mean()) * online_share
    if max_concurrency is None or max_concurrency >= len(laws):
        return free
    mean_latency = laws.total(lambda law: law.mean()) / len(laws)
    return min(free, max_concurrency / mean_latency)


def advise(
    latencies: Sequence[RunLatency] | Laws,
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
    laws = latencies if isinstance(latencies, Laws) else Laws(latencies)
    slow = fleet_quantile(laws, quantile)
    expected = rate_per_s * slow

    def backed_off(share: float) -> int:
        return min(TAU_MAX_LIMIT, max(0, math.floor(expected * (1 - share))))

    recommended = backed_off(backoff)
    evaluated = recommended if tau_max is None else tau_max
    cutoff = evaluated / rate_per_s  # τ ≈ r·L > τ_max  ⇔  L > τ_max / r
    too_slow = 1.0 - laws.cdfs(cutoff)
    dropped = tuple(np.flatnonzero(too_slow >= PERMANENT).tolist())
    weights = laws.per_device(lambda law: 1.0 / law.mean())  # fast devices submit more often
    dropped_updates = _total(weights * too_slow) / _total(weights)
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
        permanently_dropped_share=len(dropped) / len(laws),
        dropped_update_share=dropped_updates,
    )
