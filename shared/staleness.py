"""The five staleness rules s(τ) of FedAsync (Xie, Koyejo, Gupta 2019) and FedBuff's weight.

Each rule is a pure function of τ (and, for the progress rule, of t). α = α0·s(τ) is computed afresh
for every update from α0; it is never accumulated across updates (Plato's known bug multiplies the
previous α by s(τ) again). The hinge is the paper's 1/(a(τ−b)+1), not FedLab's 1/(a(τ−b+1)).
"""

from __future__ import annotations

from enum import StrEnum


class Decay(StrEnum):
    """Which staleness rule turns τ into a factor in (0, 1]."""

    CONSTANT = "constant"
    POLYNOMIAL = "polynomial"
    PROGRESS = "progress"
    EXPONENTIAL = "exponential"
    HINGE = "hinge"


def clamp_tau(tau: int) -> int:
    """τ < 0 can only come from a clock or version glitch; it is treated as perfectly fresh."""
    return tau if tau > 0 else 0


def constant(tau: int) -> float:
    """s(τ) = 1: no discount; useful only to see how much jitter asynchrony itself causes."""
    return 1.0


def polynomial(tau: int, gamma: float) -> float:
    """s(τ) = (τ + 1)^−γ."""
    return float((clamp_tau(tau) + 1) ** -gamma)


def progress(tau: int, t: int, gamma: float) -> float:
    """s(τ) = (t + τ + 1)^−γ: also shrinks as the server version t grows."""
    return float((max(t, 0) + clamp_tau(tau) + 1) ** -gamma)


def exponential(tau: int, lam: float) -> float:
    """s(τ) = λ^τ."""
    return float(lam ** clamp_tau(tau))


def hinge(tau: int, a: float, b: int) -> float:
    """s(τ) = 1 for τ ≤ b, else 1 / (a(τ − b) + 1)."""
    tau = clamp_tau(tau)
    if tau <= b:
        return 1.0
    return 1.0 / (a * (tau - b) + 1.0)


def factor(
    decay: Decay,
    tau: int,
    *,
    t: int,
    gamma: float,
    lam: float,
    hinge_a: float,
    hinge_b: int,
) -> float:
    """s(τ) for the chosen rule; the one dispatch every caller goes through."""
    if decay is Decay.CONSTANT:
        return constant(tau)
    if decay is Decay.POLYNOMIAL:
        return polynomial(tau, gamma)
    if decay is Decay.PROGRESS:
        return progress(tau, t, gamma)
    if decay is Decay.EXPONENTIAL:
        return exponential(tau, lam)
    if decay is Decay.HINGE:
        return hinge(tau, hinge_a, hinge_b)
    raise ValueError(f"unknown decay rule {decay!r}")  # pragma: no cover - enum is closed
