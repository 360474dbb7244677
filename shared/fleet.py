"""How long devices take and when they are online: latency profiles and availability.

Pure and seeded: every draw comes from a generator the caller injects, so the simulator (in
virtual time) and a device worker imitating a slow device (time-scaled) draw the same way.

A profile spreads devices' *typical* latencies over the fleet (some devices are persistently
slow, as edge boards are); each run then varies around its device's median by a lognormal
factor exp(σ·z), the per-run jitter.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

import numpy as np

_NORMAL = NormalDist()
#: NormalDist's own constant (statistics._SQRT2)
_SQRT2 = math.sqrt(2.0)


class RunLatency(Protocol):
    """One device's duration of a training run, in seconds."""

    def sample(self, rng: np.random.Generator) -> float: ...
    def cdf(self, seconds: float) -> float: ...
    def quantile(self, q: float) -> float: ...
    def mean(self) -> float: ...


@dataclass(frozen=True, slots=True)
class DeviceLatency:
    """Median × exp(σ·z), z ~ N(0, 1). Always draws once per run, even when σ = 0."""

    median_s: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (self.median_s > 0 and math.isfinite(self.median_s)) or self.jitter < 0:
            raise ValueError(f"latency median must be > 0 and jitter >= 0, got {self}")

    def sample(self, rng: np.random.Generator) -> float:
        z = float(rng.standard_normal())
        return self.median_s * math.exp(self.jitter * z) if self.jitter else self.median_s

    def cdf(self, seconds: float) -> float:
        if seconds <= 0:
            return 0.0
        if not self.jitter:
            return 1.0 if seconds >= self.median_s else 0.0
        return _NORMAL.cdf(math.log(seconds / self.median_s) / self.jitter)

    def quantile(self, q: float) -> float:
        if not self.jitter:
            return self.median_s
        return self.median_s * math.exp(
            self.jitter * _NORMAL.inv_cdf(min(max(q, 1e-12), 1 - 1e-12))
        )

    def mean(self) -> float:
        return self.median_s * math.exp(self.jitter**2 / 2)

    def scaled(self, factor: float) -> DeviceLatency:
        """The same shape in another time unit (a worker imitating this device in real time)."""
        return DeviceLatency(self.median_s * factor, self.jitter)


def device_cdfs(medians_s: np.ndarray, jitters: np.ndarray, seconds: float) -> np.ndarray:
    """`DeviceLatency(m, j).cdf(seconds)` for many laws at once, bit for bit the same values.

    The τ advisor bisects on the fleet's CDF (sim/advisor.py): on a fleet of 100,000 distinct
    laws (log-normal, Pareto, exponential medians) that was 40 million calls of `cdf` (issue
    29). Divisions and the final affine step are IEEE operations, the same in numpy; the log
    and erf are `math`'s own, mapped over the values, as `cdf` and `NormalDist.cdf` call them.
    """
    out = np.zeros(len(medians_s), dtype=np.float64)
    if seconds <= 0:
        return out
    smooth = jitters != 0
    out[~smooth] = (seconds >= medians_s[~smooth]).astype(np.float64)
    ratio = (seconds / medians_s[smooth]).tolist()
    z = np.fromiter(map(math.log, ratio), np.float64, len(ratio)) / jitters[smooth]
    scaled = (z / _SQRT2).tolist()  # NormalDist(0, 1).cdf: 0.5 · (1 + erf((x − 0) / (1·√2)))
    out[smooth] = 0.5 * (1.0 + np.fromiter(map(math.erf, scaled), np.float64, len(scaled)))
    return out


@dataclass(slots=True)
class ReplayedLatency:
    """A recorded device: its durations in order, replayed cyclically; draws nothing."""

    durations_s: tuple[float, ...]
    cursor: int = 0

    def __post_init__(self) -> None:
        if not self.durations_s or not all(d > 0 and math.isfinite(d) for d in self.durations_s):
            raise ValueError("a replayed device needs at least one positive duration")

    def sample(self, rng: np.random.Generator) -> float:
        value = self.durations_s[self.cursor % len(self.durations_s)]
        self.cursor += 1
        return value

    def cdf(self, seconds: float) -> float:
        return sum(d <= seconds for d in self.durations_s) / len(self.durations_s)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.durations_s)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    def mean(self) -> float:
        return sum(self.durations_s) / len(self.durations_s)


# ------------------------------------------------------------------------------ fleet profiles
@dataclass(frozen=True, slots=True)
class Mixture:
    """Tiers of (share of devices, median seconds); counts by largest remainder, then shuffled."""

    tiers: tuple[tuple[float, float], ...]
    jitter: float = 0.2

    def devices(self, n: int, rng: np.random.Generator) -> list[DeviceLatency]:
        shares = [share for share, _ in self.tiers]
        total = sum(shares)
        exact = [n * s / total for s in shares]
        counts = [math.floor(e) for e in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
        for i in by_remainder[: n - sum(counts)]:
            counts[i] += 1
        laws = [DeviceLatency(m, self.jitter) for _, m in self.tiers]  # immutable: shared
        by_slot = [law for law, c in zip(laws, counts, strict=True) for _ in range(c)]
        return [by_slot[i] for i in rng.permutation(n).tolist()]


def slowest(medians: Sequence[float], share: float) -> list[int]:
    """The ⌈share·n⌉ devices with the largest medians (ties: lower index first), ascending.

    Which devices the `rare_class_on_slow` partition gives the rare class: the simulator and a
    device worker ask the same question of the same profile draws, so they agree.
    """
    count = max(1, min(len(medians), int(np.ceil(share * len(medians) - 1e-9))))
    ranked = sorted(range(len(medians)), key=lambda d: (-medians[d], d))
    return sorted(ranked[:count])


#: The write-up's fleet (section 1.2): 70% ~30 s, 20% ~90 s, 8% ~3 min, 2% ~10 min.
LONG_TAIL = Mixture(((0.70, 30.0), (0.20, 90.0), (0.08, 180.0), (0.02, 600.0)))


@dataclass(frozen=True, slots=True)
class LogNormalFleet:
    """Device medians lognormal around `median_s` with spread `sigma`."""

    median_s: float = 60.0
    sigma: float = 0.8
    jitter: float = 0.2

    def devices(self, n: int, rng: np.random.Generator) -> list[DeviceLatency]:
        medians = self.median_s * np.exp(self.sigma * rng.standard_normal(n))
        return [DeviceLatency(float(m), self.jitter) for m in medians]


@dataclass(frozen=True, slots=True)
class ParetoFleet:
    """Device medians `scale_s`·(1 + Lomax(shape)): heavy-tailed, a few devices very slow."""

    scale_s: float = 30.0
    shape: float = 1.5
    jitter: float = 0.2

    def devices(self, n: int, rng: np.random.Generator) -> list[DeviceLatency]:
        medians = self.scale_s * (1.0 + rng.pareto(self.shape, n))
        return [DeviceLatency(float(m), self.jitter) for m in medians]


@dataclass(frozen=True, slots=True)
class ExponentialFleet:
    """Device medians `minimum_s` + Exp(`mean_s`)."""

    mean_s: float = 60.0
    minimum_s: float = 1.0
    jitter: float = 0.2

    def devices(self, n: int, rng: np.random.Generator) -> list[DeviceLatency]:
        medians = self.minimum_s + rng.exponential(self.mean_s, n)
        return [DeviceLatency(float(m), self.jitter) for m in medians]


@dataclass(frozen=True, slots=True)
class FixedFleet:
    """Exactly these medians (cycled if the fleet is larger): for closed-form checks."""

    medians_s: tuple[float, ...]
    jitter: float = 0.0

    def devices(self, n: int, rng: np.random.Generator) -> list[DeviceLatency]:
        return [
            DeviceLatency(self.medians_s[i % len(self.medians_s)], self.jitter) for i in range(n)
        ]


# ------------------------------------------------------------------------------ availability
class Availability(Protocol):
    """When a device is online. Times are seconds from the start of the run."""

    def online_at(self, t: float) -> bool: ...
    def window_end(self, t: float) -> float: ...
    def next_online(self, t: float) -> float | None: ...


class AlwaysOnline:
    """Online from start to end."""

    def online_at(self, t: float) -> bool:
        return True

    def window_end(self, t: float) -> float:
        return math.inf

    def next_online(self, t: float) -> float | None:
        return t


@dataclass(slots=True)
class Windows:
    """Online only in the given [start, end) windows (sorted, disjoint), as in a trace."""

    windows: Sequence[tuple[float, float]]

    def _index(self, t: float) -> int:
        """i if t is in window i; −1 − j if t is before window j (j = len: after the last)."""
        j = bisect.bisect_right(self.windows, t, key=lambda w: w[1])
        if j < len(self.windows) and self.windows[j][0] <= t:
            return j
        return -1 - j

    def online_at(self, t: float) -> bool:
        return self._index(t) >= 0

    def window_end(self, t: float) -> float:
        i = self._index(t)
        return self.windows[i][1] if i >= 0 else t

    def next_online(self, t: float) -> float | None:
        i = self._index(t)
        if i >= 0:
            return t
        following = -1 - i
        return self.windows[following][0] if following < len(self.windows) else None


@dataclass(slots=True)
class Intermittent:
    """Alternating online and offline periods, exponential with the given means.

    Starts online with probability on/(on + off). The schedule is drawn lazily from its own
    generator, so it is the same whatever the device does and however far a run goes.
    """

    online_mean_s: float
    offline_mean_s: float
    rng: np.random.Generator
    _windows: list[tuple[float, float]] = field(default_factory=list)
    _horizon: float = 0.0

    def __post_init__(self) -> None:
        if not (self.online_mean_s > 0 and self.offline_mean_s > 0):
            raise ValueError("online and offline means must be > 0")
        share = self.online_mean_s / (self.online_mean_s + self.offline_mean_s)
        if self.rng.random() >= share:
            self._horizon = float(self.rng.exponential(self.offline_mean_s))

    def _extend(self, t: float) -> None:
        while self._horizon <= t:
            start = self._horizon
            end = start + float(self.rng.exponential(self.online_mean_s))
            self._windows.append((start, end))
            self._horizon = end + float(self.rng.exponential(self.offline_mean_s))

    def _current(self, t: float) -> Windows:
        self._extend(t)
        return Windows(self._windows)

    def online_at(self, t: float) -> bool:
        return self._current(t).online_at(t)

    def window_end(self, t: float) -> float:
        return self._current(t).window_end(t)

    def next_online(self, t: float) -> float | None:
        current = self._current(t)
        found = current.next_online(t)
        return found if found is not None else self._horizon
