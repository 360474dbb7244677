"""The vocabulary of the policy schema: ranges, the error they raise, and each field's metadata.

`Policy` (shared/policy.py) declares every field once with `param()`: default, range, description
and scope. The core validates against that, and the settings, the simulator's config, the command
line flags, the control API and the docs are derived from it, so an error message, a 422 and the
documentation can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class ParamError(ValueError):
    """A parameter outside its allowed range; names the parameter, the value and the range."""

    def __init__(self, param: str, value: object, allowed: str) -> None:
        self.param = param
        self.value = value
        self.allowed = allowed
        super().__init__(f"{param} = {value!r} is not allowed; allowed: {allowed}")


class Conflict(ParamError):
    """A value its own range allows that conflicts with the policy's other fields (a robust
    rule in a mode without a buffer, DP with the poisoning bound) or with the run in force
    (differential privacy turned off, a privacy budget raised). The control API answers it
    409 Conflict, as other refusals that depend on what is in force; a bad value is 422."""


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

#: The most clients a policy may let the server remember (`memory_clients`).
MEMORY_CLIENTS_LIMIT = 1_000_000

#: The longest history of delta norms the poisoning bound may look back over; the core keeps this
#: many, so raising `norm_window` at runtime takes effect at once.
NORM_WINDOW_LIMIT = 1000
#: Fewer applied updates than this in the history: no bound applies yet (a median of two or three
#: norms says little about what is normal).
NORM_MIN_HISTORY = 5


class Scope(StrEnum):
    """When a policy field may be set."""

    #: chosen before a run (a setting, a `fedasync up` flag, a simulator key) and at runtime
    START = "start"
    #: operator state, set only at runtime (PATCH /v1/policy, switches): pauses, runtime budgets
    RUNTIME = "runtime"
    #: the policy's version: raised by `Policy.evolve()`, set by nobody
    VERSION = "version"


#: where a policy field keeps its `Param` in the dataclass field's metadata
PARAM_KEY = "fedasync.param"


@dataclass(frozen=True, slots=True)
class Param:
    """What the schema says about a policy field besides its type and default."""

    description: str
    #: the values a number may take; None for enums and flags (their type says it)
    allowed: Range | None = None
    scope: Scope = Scope.START
    #: left out of `Policy.to_dict()` while at its default: a field added after ledgers and
    #: checkpoints began recording policies, so that runs not using it record the same bytes
    quiet: bool = False


def param(
    default: T,
    description: str,
    allowed: Range | None = None,
    scope: Scope = Scope.START,
    *,
    quiet: bool = False,
) -> T:
    """A policy field with its default, description, range and scope, declared in one place."""
    meta = {PARAM_KEY: Param(description, allowed, scope, quiet)}
    return field(default=default, metadata=meta)
