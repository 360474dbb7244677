"""The Gaussian noise of a server step, drawn from the run's secret: pure and reproducible.

The noise of server step v (the version the step creates) comes from a numpy Generator
(PCG64) seeded with HMAC-SHA256(secret, "fedasync-dp/<purpose>/<v>"). Anyone holding the secret
(the aggregator, an admin running `ledger verify`, the simulator, which derives it from its
seed) draws the same bits in any process, so DP decisions replay bit for bit; without it the
noise cannot be predicted or subtracted. Each purpose (the delta's noise, the adaptive clip's
count noise) has its own stream, so one never shifts the other.

The bits are those of numpy's PCG64 and `standard_normal`, stable across processes and
machines for a given numpy; a numpy that changed them would need a new key version here.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

#: what a noise stream is for; part of its key
DELTA = "delta"
COUNT = "count"


def generator(secret: bytes, step: int, purpose: str) -> np.random.Generator:
    """The generator of `purpose` at server step `step` of the run keyed by `secret`."""
    digest = hmac.new(secret, f"fedasync-dp/{purpose}/{step}".encode(), hashlib.sha256).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))


def gaussian(secret: bytes, step: int, size: int, std: float) -> np.ndarray:
    """N(0, std²·I) of `size` float64 values: the noise added to server step `step`."""
    noise = generator(secret, step, DELTA).standard_normal(size)
    noise *= std
    return noise


def count_draw(secret: bytes, step: int) -> float:
    """One standard normal value: the adaptive clip's count noise at server step `step`."""
    return float(generator(secret, step, COUNT).standard_normal())
