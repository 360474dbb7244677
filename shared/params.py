"""Allowed ranges of the policy's parameters, kept as data.

The core validates against these, the settings and the control API report them, and the docs list
them: one table, so an error message, a 422 and the documentation can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ParamError(ValueError):
    """A parameter outside its allowed range; names the parameter, the value and the range."""

    def __init__(self, param: str, value: object, allowed: str) -> None:
        self.param = param
        self.value = value
        self.allowed = allowed
        super().__init__(f"{param} = {value!r} is not allowed; allowed: {allowed}")


@dataclass(frozen=True, slots=True)
class Range:
    """A closed, open or half-open interval of numbers, optionally integers only."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    #: None is allowed too (a feature that is off)
    optional: bool = False

    def contains(self, value: float | None) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def check(self, param: str, value: float | None) -> None:
        """Raise ParamError unless `value` lies in the range."""
        if not self.contains(value):
            raise ParamError(param, value, str(self))

    def __str__(self) -> str:
        kind = "integer in " if self.integer else ""
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        off = " or null" if self.optional else ""
        return f"{kind}{left}{_fmt(self.low)}, {_fmt(self.high)}{right}{off}"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


#: The largest τ_max a policy may set. The dedup horizon is at least this, so an update older than
#: the horizon would be dropped as stale under every valid policy.
TAU_MAX_LIMIT = 1000

#: The longest history of delta norms the poisoning bound may look back over; the core keeps this
#: many, so raising `norm_window` at runtime takes effect at once.
NORM_WINDOW_LIMIT = 1000
#: Fewer applied updates than this in the history: no bound applies yet (a median of two or three
#: norms says little about what is normal).
NORM_MIN_HISTORY = 5

#: Ranges of every numeric policy parameter. Bounds are chosen so that α = α0·s(τ) stays a positive
#: float64 for every τ ≤ TAU_MAX_LIMIT (no underflow to zero), which the property tests check.
POLICY_RANGES: dict[str, Range] = {
    "version": Range(0, 2**63 - 1, integer=True),
    "alpha0": Range(0.001, 1.0),
    "gamma": Range(0.0, 10.0, low_open=True),
    "lam": Range(0.5, 1.0),
    "hinge_a": Range(0.0, 1000.0, low_open=True),
    "hinge_b": Range(0, TAU_MAX_LIMIT, integer=True),
    "tau_max": Range(0, TAU_MAX_LIMIT, integer=True),
    "buffer_size": Range(1, 10_000, integer=True),
    "server_lr": Range(0.0, 10.0, low_open=True),
    # poisoning bound: k × the median delta norm of recent applied updates; null turns it off.
    # k < 1 would refuse or shrink most ordinary updates, so the smallest factor is 1.
    "norm_bound": Range(1.0, 1000.0, optional=True),
    "norm_window": Range(NORM_MIN_HISTORY, NORM_WINDOW_LIMIT, integer=True),
}

#: Budgets a policy may set at runtime (each may also be left unset: the configured one holds).
BUDGET_RANGES: dict[str, Range] = {
    "max_updates": Range(1, 2**63 - 1, integer=True),
    "max_seconds": Range(0.0, 1e12, low_open=True),
}
