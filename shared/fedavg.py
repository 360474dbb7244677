"""Synchronous FedAvg's aggregate: the sample-weighted mean of the round's models.

The core's only FedAvg (McMahan et al. 2017), so the simulator's synchronous baseline and any
service that ever runs rounds average the same way. Sums run in float64 with numpy's pairwise
summation (never BLAS), so the result is bit-identical on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
