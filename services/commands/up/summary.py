"""The end-of-run summary of `fedasync up`, computed from the ledger and the evaluator's curve.

Pure: records in, a JSON-safe dict out, so it is tested on hand-made ledgers. The ledger is the
authority (every decision, in commit order); the curve says how good the model got.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from fedasync.services.control.privacy import Spent
from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.shared.acceptance import acceptance_rows, count_acceptance
from fedasync.shared.device_privacy import worst_of
from fedasync.shared.per_class import lagging_classes
from fedasync.shared.stats import AppliedRate, stats


def summarize(
    records: Sequence[dict[str, Any]],
    curve: Sequence[EvaluationRecord],
    *,
    ended_by: str,
    dead_letters: int,
    started_at: float | None,
    wall_seconds: float,
    dead_letter_reasons: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """`dead_letter_reasons`: the dead-letter stream's entries counted by reason (every refusal
    is one; the core's rejections are in the ledger too, with the same reasons)."""
    outcomes = Counter(r["outcome"] for r in records)
    reasons: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        if r.get("reason"):
            reasons[r["outcome"]][str(r["reason"])] += 1
    applied = [r for r in records if r["outcome"] == "applied"]
    taus = [float(r["tau"]) for r in records if r.get("tau") is not None]
    taus_applied = [float(r["tau"]) for r in applied if r.get("tau") is not None]
    alphas = [float(r["alpha"]) for r in applied if r.get("alpha") is not None]
    training_s = None
    if applied and started_at is not None:
        training_s = max(float(applied[-1]["at"]) - started_at, 1e-9)
    rate = AppliedRate()  # the live view's figure too: start-up is not part of it
    for r in applied:
        rate.add(float(r["at"]), r["outcome"])
    final = curve[-1] if curve else None
    out: dict[str, Any] = {
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
        "dead_letter_reasons": dict(sorted((dead_letter_reasons or {}).items())),
        "training_seconds": training_s,
        "applied_per_second": rate.per_second,
        "tau": stats(taus),  # every decision with a τ: dropped ones too
        "tau_applied": stats(taus_applied),
        "alpha": stats(alphas),
        "final": None
        if final is None
        else {
            "version": final.version,
            "score": final.score,
            "accuracy": final.accuracy,
            "loss": final.loss,
            "per_class": final.per_class,
            "lagging_classes": [c.to_dict() for c in lagging_classes(final.per_class)],
        },
        "evaluations": len(curve),
        "clients": acceptance_rows(count_acceptance(records)),
    }
    device_privacy = worst_of(records)
    if device_privacy is not None:  # devices trained with DP-SGD: the fleet's worst ε
        out["device_privacy"] = device_privacy
    return out


def spent(records: Sequence[dict[str, Any]]) -> Spent:
    """ε after the last decision that carried it (differential privacy), as the ledger says."""
    for r in reversed(records):
        carried = Spent.in_record(r)
        if carried is not None:
            return carried
    return Spent()


def fairness(
    clients: Sequence[dict[str, Any]],
    alerts: Sequence[dict[str, Any]],
    *,
    min_rate: float,
    decisions: int,
    enabled: bool,
) -> dict[str, Any]:
    """Which clients the fairness rule alerted on, and why each other client under its rate
    was not: the rule judges a client on its last `decisions` decisions only once it has that
    many, so a slow device that sent fewer in the run is never judged, however many it lost.

    `clients`: the summary's acceptance rows (the whole run); `alerts`: the alerts stream's
    entries. The rule looks at each client's last `decisions` only, so a client can also be
    under the rate over the run and not over those.
    """
    alerted = sorted({str(a["client"]) for a in alerts if a.get("rule") == "fairness"})
    unalerted = []
    for row in clients:
        if row["rate"] >= min_rate or row["client"] in alerted:
            continue
        if not enabled:
            why = "the fairness rule is disabled"
        elif row["decided"] < decisions:
            why = f"{row['decided']} decisions, fewer than the {decisions} it is judged on"
        else:
            why = f"at or above {min_rate:.0%} over its last {decisions} whenever the rule looked"
        unalerted.append({"client": row["client"], "rate": row["rate"], "why": why})
    return {
        "min_rate": min_rate,
        "decisions": decisions,
        "enabled": enabled,
        "alerted": alerted,
        "below_rate_not_alerted": unalerted,
    }
