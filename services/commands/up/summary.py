"""The end-of-run summary of `fedasync up`, computed from the ledger and the evaluator's curve.

Pure: records in, a JSON-safe dict out, so it is tested on hand-made ledgers. The ledger is the
authority (every decision, in commit order); the curve says how good the model got.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.shared.acceptance import acceptance_rows, count_acceptance
from fedasync.sim.summary import stats


def summarize(
    records: Sequence[dict[str, Any]],
    curve: Sequence[EvaluationRecord],
    *,
    ended_by: str,
    dead_letters: int,
    started_at: float | None,
    wall_seconds: float,
) -> dict[str, Any]:
    outcomes = Counter(r["outcome"] for r in records)
    reasons: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        if r.get("reason"):
            reasons[r["outcome"]][str(r["reason"])] += 1
    applied = [r for r in records if r["outcome"] == "applied"]
    taus = [float(r["tau"]) for r in records if r.get("tau") is not None]
    alphas = [float(r["alpha"]) for r in applied if r.get("alpha") is not None]
    training_s = None
    if applied and started_at is not None:
        training_s = max(float(applied[-1]["at"]) - started_at, 1e-9)
    # the rate from the first decision to the last applied update: start-up (services, the
    # workers' first training) is not part of it
    applied_per_second = None
    if len(applied) > 1:
        span = float(applied[-1]["at"]) - float(records[0]["at"])
        applied_per_second = (len(applied) - 1) / span if span > 0 else None
    final = curve[-1] if curve else None
    return {
        "ended_by": ended_by,
        "wall_seconds": wall_seconds,
        "version": max((int(r["version"]) for r in records), default=0),
        "updates": {
            "decided": len(records),
            "applied": outcomes["applied"],
            "dropped": outcomes["dropped"],
            "rejected": outcomes["rejected"],
            "duplicate": outcomes["duplicate"],
            "dead_letters": dead_letters,
        },
        "reasons": {outcome: dict(counts) for outcome, counts in sorted(reasons.items())},
        "training_seconds": training_s,
        "applied_per_second": applied_per_second,
        "tau": stats(taus),
        "alpha": stats(alphas),
        "final": None
        if final is None
        else {
            "version": final.version,
            "score": final.score,
            "accuracy": final.accuracy,
            "loss": final.loss,
            "per_class": final.per_class,
        },
        "evaluations": len(curve),
        "clients": acceptance_rows(count_acceptance(records)),
    }
