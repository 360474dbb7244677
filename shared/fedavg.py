"""Synchronous FedAvg's aggregate: the sample-weighted mean of the round's models.

The core's only FedAvg (McMahan et al. 2017), so the simulator's synchronous baseline and any
service that ever runs rounds average the same way. Sums run in float64 with numpy's pairwise
summation (never BLAS), so the result is bit-identical on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedasync.shared.privacy.clipping import clip_delta


def fedavg(models: Sequence[np.ndarray], num_samples: Sequence[int]) -> np.ndarray:
    """Σ nᵢ·wᵢ / Σ nᵢ as a new float32 vector; the inputs are only read."""
    if not models:
        raise ValueError("fedavg needs at least one model")
    if len(models) != len(num_samples):
        raise ValueError(f"{len(models)} models but {len(num_samples)} sample counts")
    size = models[0].shape
    for model in models:
        if model.ndim != 1 or model.shape != size:
            raise ValueError(f"every model must be flat of shape {size}, got {model.shape}")
    counts = [int(n) for n in num_samples]
    if any(n < 1 for n in counts):
        raise ValueError(f"sample counts must be >= 1, got {counts}")
    stacked = np.stack([m.astype(np.float64) for m in models])
    weights = np.asarray(counts, dtype=np.float64) / float(sum(counts))
    mean = np.sum(stacked * weights[:, None], axis=0)
    if not np.isfinite(mean).all():
        raise ValueError("the weighted mean is not finite")
    result: np.ndarray = mean.astype(np.float32)
    return result


def dp_fedavg(
    weights: np.ndarray,
    models: Sequence[np.ndarray],
    expected: int,
    clip: float,
    noise: np.ndarray,
) -> np.ndarray:
    """DP-FedAvg's round (McMahan et al. 2018, "Learning differentially private recurrent
    language models", the fixed-denominator estimator with uniform weights):

        x ← x + (Σ clip_C(x_i − x) + N(0, z²C²I)) / m

    with m = `expected` the results a round waits for (a fixed denominator, so one device
    moves the sum by at most C and the mean by C/m, whatever the round's size) and `noise` the
    round's Gaussian noise of std z·C (shared/privacy/noise.py). The clip is the core's own
    (shared/privacy/clipping.py), as in DP-FedAsync and DP-FedBuff. A new float32 vector.
    """
    base = weights.astype(np.float64)
    total = np.zeros_like(base)
    for model in models:
        delta, _ = clip_delta(model.astype(np.float64) - base, clip)
        total += delta
    total += noise
    result: np.ndarray = (base + total / expected).astype(np.float32)
    return result
