"""Core throughput: AggregationState.apply against the bare numpy mix it wraps, side by side.

The ratio shows what validation, dedup, staleness and bookkeeping cost on top of the arithmetic.
Run: python bench/core.py [--sizes 10000 100000 1000000] [--updates 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Policy
from fedasync.shared.update import Update


def bare_mix(weights: np.ndarray, updates: list[np.ndarray], alpha: float) -> np.ndarray:
    """The mixing arithmetic alone, with no validation or bookkeeping."""
    for new in updates:
        weights = np.float32(1.0 - alpha) * weights + np.float32(alpha) * new
    return weights


def measure(size: int, count: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    payloads = [rng.standard_normal(size).astype(np.float32) for _ in range(count)]
    start = time.perf_counter()
    bare_mix(np.zeros(size, np.float32), payloads, 0.3)
    bare = count / (time.perf_counter() - start)

    state = AggregationState(np.zeros(size, np.float32), Layout.flat(size))
    policy = Policy()
    start = time.perf_counter()
    for i, weights in enumerate(payloads):
        base = max(state.version - i % 5, 0)
        state.apply(Update(f"u{i}", f"c{i % 50}", base, 10, weights), policy)
    core = count / (time.perf_counter() - start)
    return bare, core


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--updates", type=int, default=300)
    args = parser.parse_args()
    print(f"{'parameters':>12} {'bare mix/s':>12} {'core apply/s':>13} {'core/bare':>10}")
    for size in args.sizes:
        bare, core = measure(size, args.updates)
        print(f"{size:>12} {bare:>12.0f} {core:>13.0f} {core / bare:>10.2f}")


if __name__ == "__main__":
    main()
