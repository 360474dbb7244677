"""A token bucket: at most `burst` requests at once, `rate` per second sustained.

Pure: the caller passes the current (monotonic) time, so the rule is tested without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """Starts full; each request takes one token; tokens come back at `rate` per second."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate}, {burst}")
        return cls(rate, burst, burst, now)

    def take(self, now: float) -> float:
        """Take a token: 0.0 if granted, else the seconds until one will be there."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def wait(self, now: float) -> float:
        """Seconds until a token will be there (0.0: now), without taking it."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def is_full(self, now: float) -> bool:
        """A full bucket holds no information: it may be forgotten and recreated later."""
        self._refill(now)
        return self.tokens >= self.burst

    def _refill(self, now: float) -> None:
        elapsed = max(now - self.updated, 0.0)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = max(now, self.updated)
