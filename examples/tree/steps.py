"""Final accuracy, its paired difference to the first algorithm (seed by seed), server steps,
updates per step and τ of each algorithm over the seeds of a `--seeds` run.

    python examples/tree/steps.py runs/tree-fedbuff-vs-fedasync-seeds

Reads each seed's summary.json: how a tree's partials change the number of steps (a step takes
K to K + leaf_flush − 1 updates) and the τ the updates were weighted with.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(folder: Path) -> None:
    rows: dict[str, list[tuple[int, int, float, float, float]]] = {}
    for path in sorted(folder.glob("seed*/summary.json")):
        for name, algorithm in json.loads(path.read_text())["algorithms"].items():
            counters = algorithm["updates"]["counters"]
            tau = algorithm["tau_applied"]
            rows.setdefault(name, []).append(
                (
                    counters["server_steps"],
                    counters["applied"],
                    tau["mean"],
                    tau["p95"],
                    algorithm["final"]["score"],
                )
            )
    print(
        "| algorithm | seeds | final | final − first, paired | server steps | updates per step "
        "| mean τ | p95 τ |"
    )
    print("|---|---|---|---|---|---|---|---|")
    first = next(iter(rows.values()))
    for name, runs in rows.items():
        finals = [r[4] for r in runs]
        diffs = [r[4] - f[4] for r, f in zip(runs, first, strict=True)]
        spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        steps = statistics.mean(r[0] for r in runs)
        per_step = statistics.mean(r[1] / r[0] for r in runs)
        tau = statistics.mean(r[2] for r in runs)
        p95 = statistics.mean(r[3] for r in runs)
        print(
            f"| {name} | {len(runs)} | {statistics.mean(finals):.3f} "
            f"| {statistics.mean(diffs):+.4f} ± {spread:.4f} | {steps:.0f} | {per_step:.2f} "
            f"| {tau:.2f} | {p95:.1f} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
