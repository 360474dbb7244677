"""The mixing policy in force: an immutable, versioned value.

Every change of the policy is a new value with a higher version, and every decision records the
version that made it, so a ledger can say which settings decided any update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from typing import Any

from fedasync.shared import staleness
from fedasync.shared.params import BUDGET_RANGES, POLICY_RANGES, ParamError
from fedasync.shared.staleness import Decay


class Mode(StrEnum):
    """How accepted updates reach the model."""

    #: mix each update into the model at once: x ← (1 − α)x + α·x_new
    FEDASYNC = "fedasync"
    #: buffer K staleness-weighted deltas, then take one server step (Nguyen et al. 2022)
    FEDBUFF = "fedbuff"


class NormAction(StrEnum):
    """What the poisoning bound does with an update whose delta norm exceeds it."""

    #: refuse it (a rejection with reason `norm_bound`)
    REJECT = "reject"
    #: scale its delta down to the bound and apply it
    CLIP = "clip"


_FLOAT_PARAMS = ("alpha0", "gamma", "lam", "hinge_a", "server_lr")
_INT_PARAMS = ("version", "hinge_b", "tau_max", "buffer_size", "norm_window")
_BUDGETS = ("max_updates", "max_seconds")


@dataclass(frozen=True, slots=True, order=True)
class Policy:
    """Mixing settings. Ordered by version first, so `max(policies)` is the newest."""

    version: int = 0
    mode: Mode = Mode.FEDASYNC
    decay: Decay = Decay.POLYNOMIAL
    alpha0: float = 0.6
    gamma: float = 0.6
    lam: float = 0.9
    hinge_a: float = 10.0
    hinge_b: int = 4
    tau_max: int = 10
    buffer_size: int = 10
    server_lr: float = 1.0
    #: poisoning bound k: an update whose delta norm exceeds k × the median delta norm of the last
    #: `norm_window` applied updates is handled by `norm_action`; None: no bound (the default)
    norm_bound: float | None = None
    norm_action: NormAction = NormAction.REJECT
    norm_window: int = 20
    #: the aggregator decides nothing while paused; updates wait in the stream, none is lost
    paused: bool = False
    #: the ingest service answers 503 (retry later) instead of taking new updates; what was taken
    #: is still decided. Devices publishing straight to Redis are not affected.
    ingest_paused: bool = False
    #: budgets set at runtime; None leaves the aggregator's configured budget in force
    max_updates: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _enum(Mode, "mode", self.mode))
        object.__setattr__(self, "decay", _enum(Decay, "decay", self.decay))
        object.__setattr__(self, "norm_action", _enum(NormAction, "norm_action", self.norm_action))
        for name in _FLOAT_PARAMS:
            value = getattr(self, name)
            POLICY_RANGES[name].check(name, value)
            object.__setattr__(self, name, float(value))
        for name in _INT_PARAMS:
            POLICY_RANGES[name].check(name, getattr(self, name))
        POLICY_RANGES["norm_bound"].check("norm_bound", self.norm_bound)
        if self.norm_bound is not None:
            object.__setattr__(self, "norm_bound", float(self.norm_bound))
        for name in ("paused", "ingest_paused"):
            if not isinstance(getattr(self, name), bool):
                raise ParamError(name, getattr(self, name), "true or false")
        for name in _BUDGETS:
            value = getattr(self, name)
            if value is not None:
                BUDGET_RANGES[name].check(name, value)
        if self.max_seconds is not None:
            object.__setattr__(self, "max_seconds", float(self.max_seconds))

    def staleness(self, tau: int, t: int) -> float:
        """s(τ) under this policy's rule; t is the current version (used by the progress rule)."""
        return staleness.factor(
            self.decay,
            tau,
            t=t,
            gamma=self.gamma,
            lam=self.lam,
            hinge_a=self.hinge_a,
            hinge_b=self.hinge_b,
        )

    def alpha(self, tau: int, t: int) -> float:
        """α = α0·s(τ), computed afresh from α0 for every update."""
        return self.alpha0 * self.staleness(tau, t)

    def is_stale(self, tau: int) -> bool:
        """Updates staler than τ_max are dropped, never applied with a tiny α."""
        return staleness.clamp_tau(tau) > self.tau_max

    def evolve(self, **changes: Any) -> Policy:
        """A new policy with `changes` applied and the version raised by one."""
        if "version" in changes:
            raise ParamError("version", changes["version"], "set by evolve(), not by the caller")
        return replace(self, version=self.version + 1, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/msgpack-safe form (enums as their string values)."""
        out = asdict(self)
        out["mode"] = self.mode.value
        out["decay"] = self.decay.value
        out["norm_action"] = self.norm_action.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Strict inverse of to_dict: unknown keys are refused, missing keys take defaults."""
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ParamError(str(key), data[key], f"one of {sorted(known)}")
        return cls(**dict(data))

    @classmethod
    def fedbuff(cls, buffer_size: int = 10, server_lr: float = 1.0, tau_max: int = 100) -> Policy:
        """FedBuff as published: K buffered deltas weighted by 1/√(1+τ) (polynomial, γ = 0.5).

        τ counts applied updates, so a buffer of K makes τ roughly K times larger than in FedAsync;
        hence the larger default τ_max.
        """
        return cls(
            mode=Mode.FEDBUFF,
            decay=Decay.POLYNOMIAL,
            gamma=0.5,
            buffer_size=buffer_size,
            server_lr=server_lr,
            tau_max=tau_max,
        )


def _enum(kind: type[StrEnum], param: str, value: object) -> Any:
    try:
        return kind(value)  # type: ignore[arg-type]  # any value may be tried; ValueError if bad
    except ValueError:
        raise ParamError(param, value, f"one of {[m.value for m in kind]}") from None
