"""`device_cdfs`: the CDF of many device laws at once is `DeviceLatency.cdf`, bit for bit.

The τ advisor's figures (and so an advised τ_max) come from these values (issue 29), so they
are compared as floats with `==`, not approximately, over medians and times of many scales,
zero jitter (a step) and times at and below zero.
"""

from __future__ import annotations

import numpy as np

from fedasync.shared.fleet import DeviceLatency, device_cdfs


def test_many_laws_at_once_give_each_laws_own_cdf() -> None:
    rng = np.random.default_rng(29)
    medians = np.exp(rng.normal(3.0, 2.0, 2000))
    jitters = np.where(rng.random(2000) < 0.1, 0.0, rng.uniform(0.01, 1.5, 2000))
    medians[:5] = [1.0, 30.0, 30.0, 600.0, 1e-3]
    laws = [DeviceLatency(float(m), float(j)) for m, j in zip(medians, jitters, strict=True)]
    for seconds in [-1.0, 0.0, 1e-9, 1.0, 29.999, 30.0, 60.0, 600.0, 1e6, *rng.exponential(60, 20)]:
        got = device_cdfs(medians, jitters, float(seconds)).tolist()
        assert got == [law.cdf(float(seconds)) for law in laws], seconds
