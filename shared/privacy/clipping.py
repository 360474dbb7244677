"""The clip: each device's delta scaled to norm at most C, and the adaptive clip's update.

Fixed clipping bounds the L2 sensitivity of a server step's sum to C per device (user-level DP,
McMahan et al. 2018, "Learning differentially private recurrent language models").

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially private learning
with adaptive clipping", Algorithm 1) lets C track the γ-quantile of the update norms. Each
server step counts the step's updates whose norm was within C, b = Σ 1[‖Δ_i‖ ≤ C], releases it
with Gaussian noise of std σ_b, and moves C geometrically:

    b̃ = (b + N(0, σ_b²)) / K,        C ← C·exp(−η_C·(b̃ − γ))

The count is a second query on the same devices. So that the step's total privacy is that of
one Gaussian mechanism of multiplier z (what the accountant counts), the delta's noise uses the
larger multiplier of the paper's Theorem 1:

    z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)         (defined when z < 2σ_b; the policy checks it)
"""

from __future__ import annotations

import math

import numpy as np

from fedasync.shared.policy import Policy


def clip_delta(delta: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """`delta` (float64, finite) scaled to norm at most `bound`, and its own norm before.

    Scaled in place when it is beyond the bound: the caller's delta is a temporary of its own.
    The norm is numpy's pairwise sum of squares (not BLAS dot), so it is the same bits on
    every machine.
    """
    norm = math.sqrt(float(np.sum(delta * delta)))
    if norm > bound:
        delta *= bound / norm
    return delta, norm


def delta_noise_multiplier(policy: Policy) -> float:
    """z for the delta's noise: `dp_noise` with a fixed clip, z_Δ (Theorem 1) when adaptive."""
    z = policy.dp_noise
    if policy.dp_quantile is None:
        return z
    return float((z**-2 - (2.0 * policy.count_noise) ** -2) ** -0.5)


def next_clip(clip: float, within: int, count: int, draw: float, policy: Policy) -> float:
    """The adaptive clip after a server step of `count` updates, `within` of them within
    `clip`, with `draw` a standard normal sample of the step's count noise."""
    assert policy.dp_quantile is not None
    noised = (within + policy.count_noise * draw) / count
    return clip * math.exp(-policy.dp_clip_lr * (noised - policy.dp_quantile))
