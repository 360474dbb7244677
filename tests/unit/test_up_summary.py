"""The end-of-run summary of `fedasync up`, on a hand-made ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fedasync.services.commands.up.report import describe_fairness, print_summary
from fedasync.services.commands.up.summary import fairness, summarize
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
    console = Console(record=True, width=200)
    print_summary(console, summary, Path("runs/x"))
    shown = console.export_text()
    # the drops by reason: `closed` (after the budget) is not a staleness drop
    assert "3 applied, 2 dropped (1 closed, 1 stale), 0 rejected" in shown


def row(client: str, applied: int, decided: int) -> dict[str, Any]:
    return {"client": client, "applied": applied, "decided": decided, "rate": applied / decided}


def test_every_client_under_the_fairness_rate_is_alerted_or_says_why_not() -> None:
    """Three slow devices at 0–9%, fairness alerts for two: the third sent fewer updates than
    the rule judges a client on (FEDASYNC_CONTROL__FAIRNESS_DECISIONS), so the summary says so."""
    clients = [
        row("device-0", 0, 21),
        row("device-1", 1, 11),
        row("device-8", 2, 22),
        row("device-5", 3, 25),  # 12%: above the rate over the run
        row("device-9", 60, 61),
    ]
    alerts = [
        {"rule": "fairness", "client": "device-0", "message": "client device-0: 0 of its last 20"},
        {"rule": "fairness", "client": "device-0", "message": "again, after the cool-down"},
        {"rule": "drops", "message": "12 consecutive updates dropped"},
    ]
    fair = fairness(clients, alerts, min_rate=0.1, decisions=20, enabled=True)
    assert fair["alerted"] == ["device-0"]
    assert fair["below_rate_not_alerted"] == [
        {
            "client": "device-1",
            "rate": 1 / 11,
            "why": "11 decisions, fewer than the 20 it is judged on",
        },
        {
            "client": "device-8",
            "rate": 2 / 22,
            "why": "at or above 10% over its last 20 whenever the rule looked",
        },
    ]
    assert describe_fairness(fair) == (
        "device-0 (each: under 10% of its last 20 decided updates applied); "
        "device-1 9% not alerted: 11 decisions, fewer than the 20 it is judged on; "
        "device-8 9% not alerted: at or above 10% over its last 20 whenever the rule looked"
    )
    off = fairness(clients, [], min_rate=0.1, decisions=20, enabled=False)
    assert {c["why"] for c in off["below_rate_not_alerted"]} == {"the fairness rule is disabled"}
