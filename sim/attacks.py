"""Malicious devices in the simulator: which ones, and what they send instead of their update.

A malicious device trains as an honest one would (from the model it was sent, on its own data,
or, for the backdoor, on its data with a trigger stamped in: learning/backdoor.py) and then
sends x_base + T(Δ), Δ = x_new − x_base its honest delta, with T one of the model-poisoning
attacks the robustness literature tests against (Zeno++, Xie et al. 2020; Krum, Blanchard et al.
2017; FLTrust, Cao et al. 2021):

- sign_flip: T(Δ) = −Δ, the update that undoes the honest progress;
- scale: T(Δ) = c·Δ (c = 10), one device shouting over the others (also the model-replacement
  boost of a backdoor, Bagdasaryan et al. 2020);
- noise: T(Δ) = ξ, ξ ~ N(0, σ²I), a delta that carries no information;
- backdoor: T(Δ) = Δ, the poison being in the data the delta was trained on.

Pure functions of their inputs and a seeded generator: the same seed gives the same attackers
and the same bits. Arithmetic is in float64, rounded once to the float32 the wire carries.
"""

from __future__ import annotations

import numpy as np

from fedasync.sim.config import AttackConfig

__all__ = ["attacked", "malicious_devices", "noise", "scaled", "sign_flipped"]


def malicious_devices(devices: int, share: float, rng: np.random.Generator) -> frozenset[int]:
    """round(share·devices) distinct devices (at least one), drawn once from `rng`."""
    count = min(devices, max(1, round(share * devices)))
    return frozenset(int(d) for d in rng.choice(devices, size=count, replace=False))


def sign_flipped(base: np.ndarray, trained: np.ndarray) -> np.ndarray:
    """x_base − Δ: the honest delta reversed."""
    b = base.astype(np.float64)
    return (b - (trained.astype(np.float64) - b)).astype(np.float32)


def scaled(base: np.ndarray, trained: np.ndarray, factor: float) -> np.ndarray:
    """x_base + factor·Δ."""
    b = base.astype(np.float64)
    return (b + factor * (trained.astype(np.float64) - b)).astype(np.float32)


def noise(base: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """x_base + ξ, ξ ~ N(0, std²·I) drawn from `rng` (the honest delta is not used)."""
    return (base.astype(np.float64) + rng.normal(0.0, std, size=base.shape)).astype(np.float32)


def attacked(
    config: AttackConfig, base: np.ndarray, trained: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """What a malicious device sends, having trained `trained` from `base` (module docstring);
    `rng` is its run's own attack stream (only the noise draws from it)."""
    if config.kind == "sign_flip":
        return sign_flipped(base, trained)
    if config.kind == "scale":
        return scaled(base, trained, config.factor)
    if config.kind == "noise":
        return noise(base, config.noise_std, rng)
    return trained  # backdoor: the poison is in the data it trained on
