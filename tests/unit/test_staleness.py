"""The five staleness rules pinned to the paper's definitions with hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedasync.shared import staleness
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Policy
from fedasync.shared.staleness import Decay
from fedasync.shared.update import Update

# α = 0.6·(τ+1)^−0.6, worked by hand: 2^−0.6 = e^(−0.6·ln 2) = 0.659754, ×0.6 = 0.395852, ...
POLYNOMIAL = {0: 0.6, 1: 0.395852, 5: 0.204767, 10: 0.142336}
# α = 0.6·(t+τ+1)^−0.6: at t = 100, 101^−0.6 = e^(−0.6·4.615121) = 0.062720, ×0.6 = 0.037632, ...
PROGRESS = {
    (0, 0): 0.6,
    (0, 1): 0.395852,
    (0, 5): 0.204767,
    (0, 10): 0.142336,
    (100, 0): 0.037632,
    (100, 1): 0.037410,
    (100, 5): 0.036557,
    (100, 10): 0.035560,
    (1000, 0): 0.0095037,
    (1000, 1): 0.0094980,
    (1000, 5): 0.0094753,
    (1000, 10): 0.0094471,
}


@pytest.mark.parametrize(("tau", "expected"), POLYNOMIAL.items())
@pytest.mark.parametrize("t", [0, 100, 1000])
def test_polynomial_ignores_progress(tau: int, expected: float, t: int) -> None:
    policy = Policy(decay=Decay.POLYNOMIAL, alpha0=0.6, gamma=0.6)
    assert policy.alpha(tau, t) == pytest.approx(expected, rel=2e-5)


@pytest.mark.parametrize(("t_tau", "expected"), PROGRESS.items())
def test_progress_shrinks_with_server_version(t_tau: tuple[int, int], expected: float) -> None:
    t, tau = t_tau
    policy = Policy(decay=Decay.PROGRESS, alpha0=0.6, gamma=0.6)
    assert policy.alpha(tau, t) == pytest.approx(expected, rel=2e-5)


def test_hinge_is_the_papers_not_fedlabs() -> None:
    # paper: 1/(a(τ−b)+1) = 1/(10·1+1) = 0.0909…; FedLab's 1/(a(τ−b+1)) would give 1/20 = 0.05
    assert staleness.hinge(5, a=10, b=4) == pytest.approx(1 / 11)
    assert staleness.hinge(5, a=10, b=4) != pytest.approx(0.05)
    policy = Policy(decay=Decay.HINGE, alpha0=0.6, hinge_a=10, hinge_b=4)
    assert policy.alpha(5, t=0) == pytest.approx(0.6 / 11)
    assert [staleness.hinge(tau, 10, 4) for tau in range(5)] == [1.0] * 5
    assert staleness.hinge(8, a=10, b=4) == pytest.approx(1 / 41)


def test_exponential_and_constant() -> None:
    assert staleness.exponential(0, 0.9) == 1.0
    assert staleness.exponential(3, 0.9) == pytest.approx(0.729)
    assert Policy(decay=Decay.EXPONENTIAL, alpha0=0.6, lam=0.9).alpha(10, 0) == pytest.approx(
        0.6 * 0.3486784401
    )
    assert all(Policy(decay=Decay.CONSTANT).alpha(tau, 5) == 0.6 for tau in range(11))


def test_negative_tau_is_clamped_to_fresh() -> None:
    for decay in Decay:
        policy = Policy(decay=decay)
        assert policy.alpha(-3, 7) == policy.alpha(0, 7)
        assert not policy.is_stale(-3)


def test_fedbuff_weight_is_polynomial_half() -> None:
    """FedBuff's weight 1/√(1 + τ) is the polynomial rule with γ = 0.5 (no rule of its own)."""
    for tau in range(50):
        assert staleness.polynomial(tau, 0.5) == pytest.approx(1 / math.sqrt(1 + tau))
    assert staleness.polynomial(3, 0.5) == pytest.approx(0.5)


def test_alpha_is_computed_afresh_for_every_update() -> None:
    """Plato multiplies the previous α by s(τ) again; ours is α0·s(τ) every single time."""
    policy = Policy(decay=Decay.POLYNOMIAL, alpha0=0.6, gamma=0.6)
    state = AggregationState(np.zeros(2, np.float32), Layout.flat(2))
    alphas = []
    for i in range(6):
        base = max(state.version - 1, 0)
        update = Update(f"u{i}", "c", base, 1, np.ones(2, np.float32))
        decision = state.apply(update, policy)
        if decision.tau == 1:
            alphas.append(decision.alpha)
    assert len(alphas) == 5
    assert alphas == [pytest.approx(POLYNOMIAL[1], rel=2e-5)] * 5


def test_drop_above_tau_max_not_tiny_alpha() -> None:
    policy = Policy(tau_max=10)
    assert not policy.is_stale(10)
    assert policy.is_stale(11)
