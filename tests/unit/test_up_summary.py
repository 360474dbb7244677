"""The end-of-run summary of `fedasync up`, on a hand-made ledger."""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.services.commands.up.summary import summarize
from fedasync.services.stores.evaluations import EvaluationRecord


def decision(at: float, outcome: str, client: str, tau: int, **extra: Any) -> dict[str, Any]:
    alpha = 0.5 if outcome == "applied" else None
    version = extra.pop("version", 0)
    return {
        "at": at,
        "outcome": outcome,
        "client_id": client,
        "tau": tau,
        "alpha": alpha,
        "version": version,
        "reason": extra.pop("reason", None),
    }


def test_rates_stats_and_acceptance_from_the_ledger() -> None:
    ledger = [
        decision(100.0, "applied", "fast", 0, version=1),  # start-up before this is not counted
        decision(101.0, "dropped", "slow", 12, version=1, reason="stale"),
        decision(102.0, "applied", "fast", 1, version=2),
        decision(104.0, "applied", "slow", 3, version=3),
        decision(104.5, "duplicate", "fast", 0, version=3),
        decision(105.0, "dropped", "fast", 0, version=3, reason="closed"),
    ]
    curve = [EvaluationRecord(3, 104.0, 104.1, 0.2, 0.9, 50, 0.9, {"0": 0.8, "1": 1.0})]
    summary = summarize(
        ledger, curve, ended_by="max_updates", dead_letters=0, started_at=90.0, wall_seconds=20.0
    )
    assert summary["applied_per_second"] == pytest.approx(2 / 4)  # 3 applied within 100–104 s
    assert summary["updates"] == {
        "decided": 6,
        "applied": 3,
        "dropped": 2,
        "rejected": 0,
        "duplicate": 1,
        "dead_letters": 0,
    }
    assert summary["reasons"] == {"dropped": {"closed": 1, "stale": 1}}
    assert summary["tau"]["max"] == 12
    assert summary["alpha"]["count"] == 3
    assert summary["final"]["accuracy"] == 0.9
    # worst first; the duplicate and the drop after closing are not held against anyone
    assert summary["clients"] == [
        {"client": "slow", "applied": 1, "decided": 2, "rate": 0.5},
        {"client": "fast", "applied": 2, "decided": 2, "rate": 1.0},
    ]
