"""ε from what a run has spent, with Google's dp-accounting (RDP live, PLD on demand).

Every server step of a DP run is a Gaussian mechanism on the sum of its clipped contributions:
sensitivity C per device (each contribution's norm is at most C, shared/privacy/clipping.py),
noise of std z·C (z the stated `dp_noise`; with adaptive clipping the delta's own multiplier is
raised so that delta and count together cost z, Andrew et al. 2021, Theorem 1). ε is reported
at δ = `dp_delta` under two models, with add-or-remove-one-device neighbouring (user level):

(a) **sampled** (`privacy_model = sampled`, needs `dp_population` N): each server step is
    treated as a Poisson sample of the N enrolled devices with q = K/N (FedBuff, Papaya's
    assumption; q = 1/N in FedAsync, where a step takes one update), so privacy amplification
    by sampling applies: PoissonSampledDpEvent(q, GaussianDpEvent(z)) composed over the steps.
    Its assumption is strong: which devices report is decided by their own availability and
    speed, not by a server's coin, and an adversary who knows who reported when gets no
    amplification. It is the figure comparable with FedBuff/Papaya and DP-FedAvg papers.
(b) **conservative** (the default): no amplification; a device is protected by the noise of
    the steps it contributed to, so ε = GaussianDpEvent(z) composed as many times as the
    device with the most contributions made (at most `dp_participation`, the cap the core
    enforces by dropping updates past it). If z changed during the run, the smallest z seen is
    used for every contribution: an upper bound, not the exact figure. A contribution to a
    FedBuff buffer is counted when it is taken in, before its step releases it (also an upper
    bound). It assumes nothing about who participates.

Not covered by either: fedbuff-fair's weights w_i depend on the arrival counts of every
device (public in the ledger anyway), so who participates shapes others' weights; the
accountant covers the values of the deltas, not the membership pattern.

Cost: dp-accounting takes 1.3 s to import, so it is imported inside the functions here and
only when a DP run asks for ε; a run without DP never imports it (tests/unit/
test_privacy_accounting.py). Composing a PoissonSampledDpEvent costs ~28 ms, so the RDP curve
of each distinct event is computed once (`event_rdp`) and composed linearly (count × curve),
which is exactly what RdpAccountant.compose(event, count) computes; ε is then one
`compute_epsilon` over the orders, ~0.1 ms. PLD (`pld_epsilon`) is tighter and slower: for
summaries, never per decision.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

#: (q, z, count): `count` server steps, each a Poisson sample with rate q (1: no sampling) of a
#: Gaussian mechanism of noise multiplier z
Steps = tuple[tuple[float, float, int], ...]


def event(q: float, z: float) -> Any:
    """The dp-accounting event of one server step: Gaussian(z), Poisson-sampled when q < 1."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(z)
    return gaussian if q >= 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)


@functools.cache
def orders() -> np.ndarray:
    """The RDP orders: dp-accounting's defaults, as its RdpAccountant uses them (read-only)."""
    from dp_accounting.rdp import rdp_privacy_accountant

    found = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    found.flags.writeable = False
    return found


@functools.lru_cache(maxsize=256)
def event_rdp(q: float, z: float) -> np.ndarray:
    """The RDP curve (over `orders()`) of one step of `event(q, z)`, computed once."""
    from dp_accounting.rdp import rdp_privacy_accountant

    rdp: np.ndarray = rdp_privacy_accountant.RdpAccountant(orders()).compose(event(q, z)).rdp
    rdp.flags.writeable = False
    return rdp


@functools.lru_cache(maxsize=64)
def rdp_epsilon(steps: Steps, delta: float) -> float:
    """ε at `delta` of `steps` composed (RDP), 0 when nothing was released."""
    if not any(count for _, _, count in steps):
        return 0.0
    from dp_accounting.rdp import rdp_privacy_accountant

    grid = orders()
    total = np.zeros(len(grid), dtype=np.float64)
    for q, z, count in steps:
        total += count * event_rdp(q, z)
    return float(rdp_privacy_accountant.compute_epsilon(grid, total, delta)[0])


def pld_epsilon(steps: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at `delta` of `steps` composed with privacy loss distributions (tighter than RDP;
    seconds for long runs, so for summaries only)."""
    if not any(count for _, _, count in steps):
        return 0.0
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    for q, z, count in steps:
        accountant.compose(event(q, z), count)
    return float(accountant.get_epsilon(delta))
