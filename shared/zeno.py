"""Zeno++ (Xie, Koyejo, Gupta, ICML 2020): accept an update only if it descends on held-out data.

FedAsync takes updates one at a time, so the buffered modes' robust statistics (median, Krum)
have nothing to compare an update with. Zeno++ compares it with the server's own estimate of
the descent direction instead: v = ∇f_r(x), the mean loss gradient on a small held-out set the
server keeps. In the paper a worker sends a gradient estimate g, the server would step
x ← x − γg, and the *stochastic descendant score* of g is

    Score_γ,ρ(g) = γ⟨v, g⟩ − ρ‖g‖²,

a first-order estimate of how much the step lowers the validation loss, with a penalty for a
large step; the update is taken iff Score ≥ −γε. Before scoring, g is normalised to the
magnitude of v, g̃ = (‖v‖/‖g‖)·g (the paper's Algorithm 1), so a scaled-up attack gains nothing
from its size and the score measures direction.

In FedAsync an update is a model x_new, mixed as x ← x + α(x_new − x). The pull it exerts is
Δ = x_new − x, against the current model x (as the norm bound measures it; FedAsync keeps no base
models to form x_new − x_base from, and x_new − x is how it actually moves the model). A step
that lowers the loss moves against the gradient, so the gradient estimate is g = −Δ, and

    g̃ = −(‖v‖/‖Δ‖)·Δ,   Score = −γ(‖v‖/‖Δ‖)⟨v, Δ⟩ − ρ‖v‖²,   accept iff Score ≥ −γε.

Equivalently cos(v, −Δ) ≥ ρ/γ − ε/‖v‖²: the margin ε tolerates more as the model converges and
‖v‖ shrinks, as in the paper. A zero Δ (or a zero v) has g̃ = 0 and scores 0: accepted.

The paper refreshes v lazily, every k server steps; so does `due`, with k = `zeno_every`.
The core has no data and no task: its driver (the simulator, the aggregator) computes v with
the task (`Task.gradient`) at the current weights when `due` says so and hands it in
(`AggregationState.zeno_refresh`). Sums are numpy's pairwise float64 sums, not BLAS dot, so the
score is the same bits in every process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedasync.shared.policy import Policy

__all__ = ["ValidationGradient", "ZenoScore", "due", "score"]


@dataclass(frozen=True, slots=True, eq=False)
class ValidationGradient:
    """v, the held-out set's mean loss gradient at the model of `version` (float64, read-only)."""

    version: int
    #: float64 holding float32 values: the checkpoint keeps v in 4 bytes a parameter, as the
    #: model, and restores exactly what was scored with
    gradient: np.ndarray
    #: ‖v‖², summed once per refresh
    norm_sq: float

    @classmethod
    def at(cls, version: int, gradient: np.ndarray) -> ValidationGradient:
        """v as computed by the driver at the weights of `version`, rounded to float32;
        refused if not finite."""
        with np.errstate(over="ignore"):  # an overflow to ±inf is refused just below
            v = np.asarray(gradient, dtype=np.float64).astype(np.float32).astype(np.float64)
        if v.ndim != 1:
            raise ValueError(f"a validation gradient is a flat vector, got shape {v.shape}")
        norm_sq = float(np.sum(v * v))
        if not math.isfinite(norm_sq):
            raise ValueError("the validation gradient is not finite")
        v.flags.writeable = False
        return cls(version, v, norm_sq)


@dataclass(frozen=True, slots=True)
class ZenoScore:
    """One candidate's score and what it is compared with."""

    score: float
    #: −γε: the least score accepted
    threshold: float

    @property
    def accepted(self) -> bool:
        return self.score >= self.threshold

    def detail(self, version: int) -> str:
        """The ledger's account of a rejection."""
        return (
            f"zeno++ score {self.score:.6g} < -γε = {self.threshold:.6g} "
            f"(validation gradient of version {version})"
        )


def due(current: ValidationGradient | None, version: int, policy: Policy) -> bool:
    """True when the driver must compute v afresh before the next decision: Zeno++ is on and v
    is missing, or `zeno_every` server steps old (the paper's lazy refresh)."""
    if policy.zeno_margin is None:
        return False
    return current is None or not 0 <= version - current.version < policy.zeno_every


def score(v: ValidationGradient, delta: np.ndarray, policy: Policy) -> ZenoScore:
    """Zeno++'s score of an update that pulls the model by `delta` (module docstring)."""
    if policy.zeno_margin is None:
        raise ValueError("Zeno++ is off (zeno_margin is null)")
    if delta.shape != v.gradient.shape:
        raise ValueError(f"delta of shape {delta.shape}, validation gradient {v.gradient.shape}")
    d = np.asarray(delta, dtype=np.float64)
    delta_norm = math.sqrt(float(np.sum(d * d)))
    lr, rho = policy.zeno_lr, policy.zeno_rho
    threshold = -lr * policy.zeno_margin
    if delta_norm == 0.0 or v.norm_sq == 0.0:
        return ZenoScore(0.0, threshold)
    inner = float(np.sum(v.gradient * d))
    value = -lr * (math.sqrt(v.norm_sq) / delta_norm) * inner - rho * v.norm_sq
    return ZenoScore(value, threshold)
