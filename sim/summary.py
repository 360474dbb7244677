"""summary.json: every number a run produced, deterministic to the byte.

No wall-clock value and no path of the machine enters it; floats are written by `repr` (json's
default) and keys sorted, so the same config and seed give the same bytes on any machine.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedasync.shared.per_class import lagging_classes
from fedasync.shared.stats import stats
from fedasync.sim.recorder import Recorder
from fedasync.sim.result import RunResult
from fedasync.sim.runner import Simulation

SCHEMA = 1
HOUR = 3600.0


def time_to_target(recorder: Recorder, target: float | None) -> dict[str, Any]:
    """The first evaluation at or above `target` (resolution: the evaluation interval)."""
    if target is None:
        return {"target": None, "time_s": None, "updates": None, "version": None}
    for point in recorder.evals:
        if point.score >= target:
            return {
                "target": target,
                "time_s": point.time_s,
                "updates": point.updates,
                "version": point.version,
            }
    return {"target": target, "time_s": None, "updates": None, "version": None}


def acceptance(result: RunResult, client_ids: Sequence[str], slow: Sequence[int]) -> dict[str, Any]:
    rec = result.recorder
    per_client = {
        client_ids[d]: {
            "submitted": rec.submitted[d],
            "applied": rec.applied[d],
            "lost_in_training": rec.lost[d],
            "rate": rec.applied[d] / rec.submitted[d] if rec.submitted[d] else None,
        }
        for d in range(rec.num_devices)
    }
    rates = [v["rate"] for v in per_client.values() if v["rate"] is not None]
    never = [c for c, v in per_client.items() if v["applied"] == 0]
    slow_sub = sum(rec.submitted[d] for d in slow)
    submitted = sum(rec.submitted)
    return {
        "overall": sum(rec.applied) / submitted if submitted else None,
        "min_client_rate": min(rates) if rates else None,
        "clients_never_applied": len(never),
        "share_never_applied": len(never) / rec.num_devices,
        "slow_devices_rate": sum(rec.applied[d] for d in slow) / slow_sub if slow_sub else None,
        "per_client": per_client,
    }


def attack_summary(result: RunResult, sim: Simulation) -> dict[str, Any]:
    """What the malicious devices got through, and the backdoor's success on the final model."""
    rec, world = result.recorder, sim.world
    attackers = sorted(world.attackers)
    submitted = sum(rec.submitted[d] for d in attackers)
    applied = sum(rec.applied[d] for d in attackers)
    honest_submitted = sum(rec.submitted) - submitted
    honest_applied = sum(rec.applied) - applied
    refused = Counter(
        d.reason for d in rec.decisions if d.outcome == "rejected" and d.device in world.attackers
    )
    return {
        "kind": world.config.attack.kind if world.config.attack else None,
        "malicious_devices": len(attackers),
        "malicious_submitted": submitted,
        "malicious_applied": applied,
        "malicious_acceptance": applied / submitted if submitted else None,
        "honest_acceptance": honest_applied / honest_submitted if honest_submitted else None,
        "malicious_rejected_by_reason": dict(sorted((str(k), v) for k, v in refused.items())),
        "backdoor_success": result.attack_success,
    }


def algorithm_summary(
    result: RunResult, sim: Simulation, target: float | None, window: int
) -> dict[str, Any]:
    rec = result.recorder
    world = sim.world
    final = rec.evals[-1]
    best = max(rec.evals, key=lambda p: (p.score, -p.time_s))
    recent = rec.evals[-window:]
    early = [p.loss for p in rec.evals[1 : window + 1]]  # after the first update, before trend
    arrivals = [d for d in rec.decisions if d.tau is not None]
    applied = [d for d in rec.decisions if d.outcome == "applied"]
    hours = result.end_s / HOUR
    reasons = Counter(d.reason for d in rec.decisions if d.outcome == "dropped")
    out: dict[str, Any] = {
        "kind": result.kind,
        "settings": result.settings,
        "policy_changes": list(result.policy_changes),
        "alerts": list(result.alerts),
        "ended_by": result.ended_by,
        "simulated_seconds": result.end_s,
        "final": {
            "loss": final.loss,
            "score": final.score,
            "per_class": {str(k): v for k, v in sorted(final.per_class.items())},
            "lagging_classes": [c.to_dict() for c in lagging_classes(final.per_class)],
        },
        "best": {
            "score": best.score,
            "time_s": best.time_s,
            "loss": min(p.loss for p in rec.evals),
        },
        "time_to_target": time_to_target(rec, target),
        "updates": {
            "received": sum(rec.submitted),
            "applied": rec.updates_applied,
            "dropped": sum(reasons.values()),
            "dropped_by_reason": dict(sorted((str(k), v) for k, v in reasons.items())),
            "rejected": sum(d.outcome == "rejected" for d in rec.decisions),
            "duplicate": sum(d.outcome == "duplicate" for d in rec.decisions),
            "lost_in_training": sum(rec.lost),
            "discarded_by_round": sum(rec.discarded),
            "model_versions": result.version,
            "counters": dict(sorted(result.counters.items())),
        },
        "rates": {
            "applied_per_hour": rec.updates_applied / hours if hours else None,
            "received_per_hour": sum(rec.submitted) / hours if hours else None,
            "rounds_per_hour": len(rec.rounds) / hours if hours and rec.rounds else None,
        },
        "tau": stats([float(d.tau) for d in arrivals if d.tau is not None]),
        "tau_applied": stats([float(d.tau) for d in applied if d.tau is not None]),
        "alpha": stats([d.alpha for d in applied if d.alpha is not None]),
        "step_norm": stats([d.step_norm for d in applied if d.step_norm]),
        "acceptance": acceptance(result, world.client_ids, world.slow),
        "jitter": {
            "window": len(recent),
            "loss_std": float(np.std([p.loss for p in recent])),
            # successive differences: the oscillation, without the slow downward trend
            "loss_step_std": float(np.std(np.diff([p.loss for p in recent]))),
            "early_loss_step_std": float(np.std(np.diff(early))) if len(early) > 1 else None,
            "score_std": float(np.std([p.score for p in recent])),
        },
    }
    if result.stalled is not None:  # only then: ordinary summaries keep their bytes
        out["stalled"] = result.stalled
    if result.privacy is not None:  # DP runs only, likewise
        out["privacy"] = result.privacy
        out["epsilon"] = epsilon_curve(rec)
    if world.config.attack is not None:  # likewise
        out["attack"] = attack_summary(result, sim)
    device_privacy = rec.device_privacy.to_dict()
    if device_privacy is not None:  # DP-SGD on the devices: the fleet's worst ε, and whose
        out["device_privacy"] = device_privacy
    if rec.rounds:
        durations = [r.end_s - r.start_s for r in rec.rounds]
        out["rounds"] = {"count": len(rec.rounds), "duration_s": stats(durations)}
    return out


def epsilon_curve(recorder: Recorder) -> list[dict[str, Any]]:
    """ε spent at each evaluation of a DP run, beside its loss and score curves."""
    return [
        {"time_s": t, "updates": n, "epsilon_sampled": s, "epsilon_conservative": c}
        for t, n, s, c in recorder.epsilon
    ]


def build_summary(sim: Simulation) -> dict[str, Any]:
    config = sim.world.config
    world = sim.world
    return {
        "schema": SCHEMA,
        "name": config.name,
        "seed": config.seed,
        "config": config.dump(),
        "fleet": {
            "devices": world.num_devices,
            "median_latency_s": stats(world.medians_s),
            "slow_devices": [world.client_ids[d] for d in world.slow],
            "samples_per_device": stats([float(n) for n in world.device_data.sizes()]),
        },
        "advisor": sim.advice.to_dict(),
        "algorithms": {
            r.name: algorithm_summary(r, sim, config.eval.target, config.eval.jitter_window)
            for r in sim.results
        },
    }


def dumps(summary: dict[str, Any]) -> str:
    """Canonical JSON: sorted keys, repr floats, NaN refused (it would not be JSON)."""
    return json.dumps(_finite(summary), sort_keys=True, indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
