"""FedBuff's server optimizer: how one server step turns the buffer into new weights.

FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation",
Algorithm 1) averages the K staleness-weighted client deltas of a buffer,
Δ̄ = (1/K)·Σ s(τ_i)·Δ_i with Δ_i = x_i − x_base(i), and hands −Δ̄ to a server optimizer as a
pseudo-gradient, as FedOpt does for synchronous rounds (Reddi et al. 2021, "Adaptive Federated
Optimization"). With η the server learning rate and t the steps taken under this optimizer:

    sgd        x ← x + η·Δ̄
    momentum   m ← β·m + Δ̄;  x ← x + η·m                        (heavy ball, m₀ = 0)
    adam       m ← β₁·m + (1 − β₁)·Δ̄;  v ← β₂·v + (1 − β₂)·Δ̄²
               x ← x + η·m̂ / (√v̂ + ε),  m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ)   (Kingma & Ba 2015)

These are torch's SGD (momentum, no dampening) and Adam (no weight decay) applied to −Δ̄, which is
what Meta's FLSim does with its FedBuff aggregators. Moments are float64 and part of the
checkpoint, so a restored aggregator and `ledger verify` step exactly as the original did.
Changing the optimizer at runtime starts its moments afresh; changing η, β, β₁, β₂ or ε keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedasync.shared.policy import Policy, ServerOptimizer


@dataclass(frozen=True, slots=True, eq=False)
class OptimizerState:
    """The server optimizer's memory between server steps (replaced, never written in place)."""

    #: the optimizer these moments belong to; None before the first server step
    kind: ServerOptimizer | None = None
    #: server steps taken under `kind` (Adam's t for its bias correction)
    steps: int = 0
    #: momentum's m or Adam's first moment, float64; None until needed
    first: np.ndarray | None = None
    #: Adam's second moment, float64
    second: np.ndarray | None = None


def server_step(
    weights: np.ndarray, total: np.ndarray, count: float, state: OptimizerState, policy: Policy
) -> tuple[np.ndarray, OptimizerState]:
    """The weights after one server step on a buffer holding Σ w_i·s(τ_i)·Δ_i whose weights sum
    to `count` (K in FedBuff; Σ w_i in fedbuff-fair; Σ n_i over the memory in memory mode), so
    that Δ̄ = total / count, and the optimizer state after it. Nothing is modified: the caller
    commits both, or neither.
    """
    kind = policy.server_optimizer
    if state.kind is not kind:
        state = OptimizerState(kind)
    x = weights.astype(np.float64)
    if kind is ServerOptimizer.SGD:
        # η/K folded into one factor: the formula FedBuff used before server optimizers existed
        new = x + total * (policy.server_lr / count)
        return new.astype(np.float32), OptimizerState(kind, state.steps + 1)
    mean = total / count
    steps = state.steps + 1
    if kind is ServerOptimizer.MOMENTUM:
        first = mean if state.first is None else policy.server_momentum * state.first + mean
        new = x + policy.server_lr * first
        return new.astype(np.float32), OptimizerState(kind, steps, first)
    beta1, beta2 = policy.server_beta1, policy.server_beta2
    m = (1.0 - beta1) * mean if state.first is None else beta1 * state.first + (1.0 - beta1) * mean
    squared = mean * mean
    v = (
        (1.0 - beta2) * squared
        if state.second is None
        else beta2 * state.second + (1.0 - beta2) * squared
    )
    m_hat = m / (1.0 - beta1**steps)
    v_hat = v / (1.0 - beta2**steps)
    new = x + policy.server_lr * m_hat / (np.sqrt(v_hat) + policy.server_eps)
    return new.astype(np.float32), OptimizerState(kind, steps, m, v)
