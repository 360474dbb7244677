"""A seeded stream of updates (fresh, stale, duplicate, invalid) driven through the core.

Used to show that the core is deterministic across processes: the digest printed by a child
process with another hash seed must equal the one computed here.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import save_state
from fedasync.shared.decision import Decision
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Policy
from fedasync.shared.staleness import Decay
from fedasync.shared.update import Update

SIZE = 257


def policies() -> list[Policy]:
    first = Policy(decay=Decay.POLYNOMIAL, alpha0=0.6, gamma=0.6, tau_max=6)
    return [
        first,
        first.evolve(decay=Decay.HINGE, hinge_a=10, hinge_b=2),
        Policy.fedbuff(buffer_size=3, server_lr=0.8, tau_max=8).evolve(),
        first.evolve(decay=Decay.PROGRESS).evolve(),
    ]


def run(seed: int, steps: int = 400) -> tuple[AggregationState, list[Decision]]:
    rng = np.random.default_rng(seed)
    state = AggregationState(
        rng.standard_normal(SIZE).astype(np.float32), Layout.of([("w", (SIZE - 1,)), ("b", (1,))])
    )
    plan = policies()
    decisions = []
    for step in range(steps):
        policy = plan[(step // 50) % len(plan)]
        kind = rng.integers(0, 20)
        base = max(state.version - int(rng.integers(0, 10)), 0)
        update_id = f"u{int(rng.integers(0, step + 1))}" if kind < 3 else f"u{step}-{seed}"
        weights = rng.standard_normal(SIZE).astype(np.float32)
        if kind == 3:
            weights[5] = np.nan
        if kind == 4:
            base = state.version + 1
        decisions.append(state.apply(Update(update_id, f"c{step % 7}", base, 10, weights), policy))
    return state, decisions


def digest(seed: int) -> str:
    state, decisions = run(seed)
    h = hashlib.sha256(save_state(state))
    h.update(json.dumps([d.to_dict() for d in decisions], sort_keys=True).encode())
    return h.hexdigest()


if __name__ == "__main__":
    print(digest(int(sys.argv[1])))
