"""Robust rules of a FedBuff step (shared/robust.py) at K buffered deltas: before and after
Krum's distances were taken a block of rows at a time, side by side in one run.

Each row times `robust.step` over K deltas of d parameters (float32 deltas, scaled by a
staleness factor into the float64 contributions the buffer keeps), best of `--repeat`:
"old" runs it with Krum's pair-by-pair distance and score loops as they were before (kept
here, and only here, for this comparison: `old_squared_distances`, `old_krum_scores`), "new"
with the shipped ones. median and trimmed_mean were already a sort along the update axis and
are the same code in both columns (their ratio is the scatter between two runs of one code).
"same" says whether both gave the same bytes, the same excluded updates and the same detail.

Run: python bench/robust.py [--ks 10 50 100] [--sizes 2410 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from fedasync.shared import robust
from fedasync.shared.policy import RobustRule
from fedasync.shared.robust import Kept, Robust, RuleSpec


def old_squared_distances(rows: np.ndarray) -> np.ndarray:
    """The distances as they were computed before: one pair per numpy call."""
    n = rows.shape[0]
    out = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i + 1, n):
            diff = rows[i] - rows[j]
            np.square(diff, out=diff)
            out[i, j] = out[j, i] = float(np.sum(diff))
    return out


def old_krum_scores(rows: np.ndarray, byzantine: int) -> np.ndarray:
    """Krum's scores as they were computed before: one row per numpy sort and sum."""
    n = rows.shape[0]
    nearest = n - byzantine - 2
    if nearest < 1:
        raise ValueError(f"Krum needs n > 2f + 2, got n = {n}, f = {byzantine}")
    distances = old_squared_distances(rows)
    scores = np.empty(n, dtype=np.float64)
    for i in range(n):
        others = np.sort(np.delete(distances[i], i))
        scores[i] = float(np.sum(others[:nearest]))
    return scores


@contextmanager
def old_krum() -> Iterator[None]:
    """`robust.step` with the old loops in place of the shipped ones while inside."""
    shipped = robust.krum_scores
    robust.krum_scores = old_krum_scores
    try:
        yield
    finally:
        robust.krum_scores = shipped


def buffer(k: int, size: int, seed: int = 0) -> list[Kept]:
    """K contributions v_i = s(τ_i)·Δ_i in float64 from float32 deltas, as FedBuff keeps them."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(k):
        delta = rng.standard_normal(size).astype(np.float32).astype(np.float64)
        scale = 1.0 / np.sqrt(1.0 + float(rng.integers(0, 5)))
        out.append(Kept(f"u{i}", 1.0, scale * delta))
    return out


def specs(k: int) -> list[RuleSpec]:
    f = max(1, k // 10)
    return [
        RuleSpec(RobustRule.MEDIAN),
        RuleSpec(RobustRule.TRIMMED_MEAN, trim=0.1),
        RuleSpec(RobustRule.KRUM, byzantine=f),
        RuleSpec(RobustRule.MULTI_KRUM, byzantine=f),
    ]


def best(kept: list[Kept], spec: RuleSpec, repeat: int) -> tuple[float, Robust]:
    """The fastest of `repeat` steps and what it took."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        taken = robust.step(kept, spec)
        times.append(time.perf_counter() - start)
    return min(times), taken


def same(a: Robust, b: Robust) -> bool:
    return (
        a.total.dtype == b.total.dtype
        and a.total.tobytes() == b.total.tobytes()
        and (a.count, a.excluded, a.detail) == (b.count, b.excluded, b.detail)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2410, 100_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'rule':>13} {'K':>4} {'parameters':>10} {'old ms':>9} {'new ms':>9} {'old/new':>8} same"
    )
    for size in args.sizes:
        for k in args.ks:
            kept = buffer(k, size)
            for spec in specs(k):
                with old_krum():
                    old, before = best(kept, spec, args.repeat)
                new, after = best(kept, spec, args.repeat)
                print(
                    f"{spec.rule.value:>13} {k:>4} {size:>10} {old * 1e3:>9.2f} "
                    f"{new * 1e3:>9.2f} {old / new:>8.2f} {'yes' if same(before, after) else 'NO'}"
                )


if __name__ == "__main__":
    main()
