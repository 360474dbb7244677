"""Robust aggregation of a FedBuff buffer: what a server step takes of its K deltas instead of
their mean, so that a minority of malicious devices cannot steer the model.

The buffered modes (fedbuff, fedbuff-fair) step with Δ̄ = Σ v_i / Σ w_i, v_i = w_i·s(τ_i)·Δ_i
(shared/modes/fedbuff.py), which is the plain mean of u_i = v_i / w̄ with w̄ = Σ w_i / n the
mean weight (w_i = 1 in FedBuff, so u_i = s(τ_i)·Δ_i). One delta scaled ×1000 moves that mean
as far as it likes. A robust rule R replaces the mean: Δ̄ = R(u_1 … u_n), computed as R(v)/w̄,
which is the same for every rule here (each is positively homogeneous, and Krum's choice is
scale-invariant). With n the updates in the buffer (K at a step, fewer when a switch settles a
partial buffer):

    median         Δ̄_j = median_i u_ij, coordinate-wise (the mean of the two middle values
                   for an even n)                                 (Yin et al. 2018)
    trimmed_mean   Δ̄_j = mean of u_ij over i once the t = ⌊β·n⌋ lowest and t highest
                   values of coordinate j are left out            (Yin et al. 2018)
    krum           score(i) = Σ ‖u_i − u_j‖² over the n − f − 2 nearest j ≠ i;
                   Δ̄ = the u_i of the lowest score               (Blanchard et al. 2017)
    multi_krum     Δ̄ = the mean of the m lowest-scored u_i (m = n − f unless set)

Krum needs n > 2f + 2 (its guarantee, and n − f − 2 ≥ 1 neighbours): the policy refuses a K
that does not allow it, and a partial buffer settled by a switch with n ≤ 2f + 2 takes the
coordinate-wise median instead (it needs no f), saying so in the decision's detail.

Ties go to the earlier-buffered update (stable sorts), and every sum is numpy's own reduction,
never BLAS (whose threads may split a sum differently on another machine): the aggregator, the
simulator and `ledger verify` choose the same deltas and compute the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedasync.shared.policy import Policy, RobustRule


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """A robust rule with the parameters it reads: what a buffer was gathered under (a change
    of any of them at runtime settles the partial buffer under the old one first)."""

    rule: RobustRule
    #: β (trimmed_mean), else 0
    trim: float = 0.0
    #: f (krum, multi_krum), else 0
    byzantine: int = 0
    #: m (multi_krum), None for n − f
    select: int | None = None

    @classmethod
    def of(cls, policy: Policy) -> RuleSpec | None:
        """The rule `policy` steps a buffer with; None for the mean (nothing kept per update)."""
        rule = policy.robust
        if rule is RobustRule.MEAN:
            return None
        if rule is RobustRule.TRIMMED_MEAN:
            return cls(rule, trim=policy.robust_trim)
        if rule is RobustRule.KRUM:
            return cls(rule, byzantine=policy.robust_byzantine)
        if rule is RobustRule.MULTI_KRUM:
            return cls(rule, byzantine=policy.robust_byzantine, select=policy.robust_select)
        return cls(rule)

    def to_list(self) -> list[Any]:
        return [self.rule.value, self.trim, self.byzantine, self.select]

    @classmethod
    def from_list(cls, data: Any) -> RuleSpec:
        rule, trim, byzantine, select = data
        return cls(
            RobustRule(rule), float(trim), int(byzantine), None if select is None else int(select)
        )


@dataclass(frozen=True, slots=True)
class Kept:
    """One buffered update as a robust rule needs it: its id, w_i and v_i = w_i·s(τ_i)·Δ_i."""

    update_id: str
    weight: float
    #: float64, read-only
    contribution: np.ndarray


@dataclass(frozen=True, slots=True)
class Robust:
    """A robust rule's step: Δ̄·w̄ as `total` and w̄ as `count` (what `server_step` divides),
    the updates it left out and its account of the step for the decision's detail."""

    total: np.ndarray
    count: float
    excluded: tuple[str, ...]
    detail: str


def step(kept: list[Kept], spec: RuleSpec) -> Robust:
    """The robust step over the buffered updates `kept` (n ≥ 1, in buffering order)."""
    rows = np.stack([k.contribution for k in kept])
    n = len(kept)
    mean_weight = sum(k.weight for k in kept) / n
    rule = spec.rule
    if rule in (RobustRule.KRUM, RobustRule.MULTI_KRUM) and n <= 2 * spec.byzantine + 2:
        detail = (
            f"{rule.value}: {n} buffered ≤ 2f + 2 = {2 * spec.byzantine + 2}, "
            f"coordinate-wise median of {n} instead"
        )
        return Robust(median(rows), mean_weight, (), detail)
    if rule is RobustRule.MEDIAN:
        return Robust(median(rows), mean_weight, (), f"median: coordinate-wise of {n}")
    if rule is RobustRule.TRIMMED_MEAN:
        t = trimmed_count(n, spec.trim)
        detail = f"trimmed_mean: {t} of {n} left out at each end, per coordinate"
        return Robust(trimmed_mean(rows, spec.trim), mean_weight, (), detail)
    m = 1 if rule is RobustRule.KRUM else min(spec.select or n - spec.byzantine, n)
    chosen = krum_select(rows, spec.byzantine, m)
    kept_set = set(chosen)
    excluded = tuple(k.update_id for i, k in enumerate(kept) if i not in kept_set)
    total = rows[chosen[0]].copy() if m == 1 else np.sum(rows[sorted(chosen)], axis=0) / m
    return Robust(total, mean_weight, excluded, f"{rule.value}: kept {m} of {n}")


def median(rows: np.ndarray) -> np.ndarray:
    """The coordinate-wise median of the rows of `rows` (n × P): for an even n, the mean of
    the two middle values."""
    n = rows.shape[0]
    ordered = np.sort(rows, axis=0)
    middle = n // 2
    if n % 2:
        odd: np.ndarray = ordered[middle].copy()
        return odd
    even: np.ndarray = (ordered[middle - 1] + ordered[middle]) / 2.0
    return even


def trimmed_count(n: int, beta: float) -> int:
    """t = ⌊β·n⌋, the values left out at each end; β < 1/2 keeps at least one."""
    return int(np.floor(beta * n))


def trimmed_mean(rows: np.ndarray, beta: float) -> np.ndarray:
    """The coordinate-wise mean of the rows once the ⌊β·n⌋ lowest and highest values of each
    coordinate are left out."""
    n = rows.shape[0]
    t = trimmed_count(n, beta)
    ordered = np.sort(rows, axis=0)
    mean: np.ndarray = np.sum(ordered[t : n - t], axis=0) / (n - 2 * t)
    return mean


#: elements of the block of differences `squared_distances` works in (2 MiB of float64): large
#: enough that a row meets many others per numpy call, small enough to stay in cache
_BLOCK = 1 << 18


def squared_distances(rows: np.ndarray) -> np.ndarray:
    """‖r_i − r_j‖² for every pair (n × n, symmetric, zero diagonal), each a numpy pairwise
    sum of its own (not a Gram matrix through BLAS: the same bits on every machine).

    Row i is compared with a block of the rows after it at once: np.sum over the last axis of
    a C-contiguous block reduces each row of it alone, with the same pairwise summation as
    np.sum of that row by itself, so each distance has the bits of the pair-by-pair loop this
    replaces (tests/unit/test_robust.py compares the two) at a fraction of its Python calls."""
    n, size = rows.shape
    out = np.zeros((n, n), dtype=np.float64)
    per = max(1, min(n - 1, _BLOCK // max(size, 1)))
    # one block, reused (no fresh pages per call), in the rows' dtype as each pair's was
    work = np.empty((per, size), dtype=rows.dtype)
    for i in range(n - 1):
        for start in range(i + 1, n, per):
            stop = min(start + per, n)
            diff = work[: stop - start]
            np.subtract(rows[i], rows[start:stop], out=diff)
            np.square(diff, out=diff)
            sums = np.sum(diff, axis=1)
            out[i, start:stop] = sums
            out[start:stop, i] = sums
    return out


def krum_scores(rows: np.ndarray, byzantine: int) -> np.ndarray:
    """Krum's score of each row: the sum of its squared distances to its n − f − 2 nearest
    other rows (Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant
    Gradient Descent", section 4). Needs n > 2f + 2.

    Each row's distances to the others are sorted ascending and the first n − f − 2 summed,
    each row's sum a reduction of its own over a contiguous row (as for the distances)."""
    n = rows.shape[0]
    nearest = n - byzantine - 2
    if nearest < 1:
        raise ValueError(f"Krum needs n > 2f + 2, got n = {n}, f = {byzantine}")
    distances = squared_distances(rows)
    others = distances[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    others.sort(axis=1)
    scores: np.ndarray = np.sum(np.ascontiguousarray(others[:, :nearest]), axis=1)
    return scores


def krum_select(rows: np.ndarray, byzantine: int, m: int) -> list[int]:
    """The indices of the m best-scored rows, best first (ties: the earlier row)."""
    order = np.argsort(krum_scores(rows, byzantine), kind="stable")
    return [int(i) for i in order[:m]]
