"""The end-of-run summary of `fedasync up`, on a hand-made ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fedasync.services.commands.up.report import (
    describe_fairness,
    nothing_applied,
    print_summary,
    refusals,
)
from fedasync.services.commands.up.summary import fairness, spent, summarize
from fedasync.services.control.privacy import Spent
from fedasync.services.runtime.settings import load_settings
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


def run_summary(ledger: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    curve = kwargs.pop("curve", [])
    return summarize(ledger, curve, started_at=0.0, wall_seconds=60.0, **kwargs)


def shown_summary(summary: dict[str, Any]) -> str:
    console = Console(record=True, width=400)
    print_summary(console, summary, Path("runs/x"))
    return console.export_text()


def test_rejections_and_dead_letters_are_shown_with_their_reasons() -> None:
    ledger = [decision(1.0, "applied", "a", 0, version=1)] + [
        decision(2.0, "rejected", "b", 0, version=1, reason="shape_mismatch") for _ in range(3)
    ]
    dead = {"shape_mismatch": 3, "malformed": 2}  # every refusal is a dead letter
    summary = run_summary(ledger, ended_by="max_updates", dead_letters=5, dead_letter_reasons=dead)
    assert summary["dead_letter_reasons"] == {"malformed": 2, "shape_mismatch": 3}
    shown = shown_summary(summary)
    assert "3 rejected (3 shape_mismatch)" in shown
    assert "5 dead letters (3 shape_mismatch, 2 malformed)" in shown
    assert refusals(summary) == (
        "3 rejected (3 shape_mismatch), 2 refused before a decision (2 malformed)"
    )


def test_a_run_that_applied_nothing_says_why_and_what_to_do(tmp_path: Path) -> None:
    settings = load_settings(budget={"max_seconds": 20.0})
    early = run_summary([], ended_by="max_seconds", dead_letters=0)
    said = nothing_applied(early, settings, tmp_path)
    assert said is not None
    assert said.startswith("the budget of 20 s ran out before any device's first update")
    assert "--max-seconds" in said
    refused = run_summary(
        [decision(2.0, "rejected", "b", 0, reason="non_finite")],
        ended_by="max_updates",
        dead_letters=1,
        dead_letter_reasons={"non_finite": 1},
    )
    assert nothing_applied(refused, settings, tmp_path) == (
        "no update was applied: 1 rejected (1 non_finite) (summary.json, the ledger)"
    )
    assert nothing_applied(run_summary([decision(1.0, "applied", "a", 0)],
                                       ended_by="max_updates", dead_letters=0),
                           settings, tmp_path) is None  # fmt: skip


def test_tau_is_shown_for_applied_updates_and_for_all_decided_labelled() -> None:
    ledger = [
        decision(1.0, "applied", "a", 1, version=1),
        decision(2.0, "applied", "a", 2, version=2),
        decision(3.0, "dropped", "slow", 40, version=2, reason="stale"),
    ]
    summary = run_summary(ledger, ended_by="max_updates", dead_letters=0)
    assert summary["tau_applied"]["max"] == 2
    assert summary["tau"]["max"] == 40
    shown = shown_summary(summary)
    assert "τ of applied, p50 / p95 / max  │ 2 / 2 / 2" in shown
    assert "τ of all decided (dropped too) │ 2 / 36 / 40" in shown


def test_a_class_the_model_has_not_learned_is_flagged_in_one_line() -> None:
    per_class = {"0": 0.9, "1": 0.95, "2": 0.0}
    curve = [EvaluationRecord(2, 2.0, 2.1, 0.6, 0.62, 50, 0.62, per_class)]
    ledger = [decision(1.0, "applied", "a", 0, version=1)]
    summary = run_summary(ledger, ended_by="max_updates", dead_letters=0, curve=curve)
    assert summary["final"]["lagging_classes"] == [
        {"class": "2", "accuracy": 0.0, "others_median": 0.925}
    ]
    [row] = [line for line in shown_summary(summary).splitlines() if "not learned" in line]
    assert "class 2 at 0.00 (the others' median 0.93): the model has not learned it" in row


def test_the_privacy_spent_is_the_newest_record_carrying_epsilon() -> None:
    records: list[dict[str, Any]] = [
        {"outcome": "applied", "epsilon_sampled": 0.1, "epsilon_conservative": 0.5},
        {"outcome": "applied", "epsilon_sampled": 0.2, "epsilon_conservative": 1.0},
        {"outcome": "rejected"},  # a record written before DP was on, or without ε
    ]
    assert spent(records) == Spent(0.2, 1.0)
    assert spent([{"outcome": "applied"}]) == Spent()


def test_the_fleets_worst_device_epsilon_is_in_the_summary_and_its_table() -> None:
    ledger = [
        decision(1.0, "applied", "a", 0, version=1) | {"device_epsilon": 2.5, "device_delta": 1e-5},
        decision(2.0, "dropped", "b", 9, version=1, reason="stale")
        | {"device_epsilon": 4.0, "device_delta": 1e-5},
        decision(3.0, "applied", "a", 0, version=2) | {"device_epsilon": 3.0, "device_delta": 1e-5},
    ]
    summary = summarize(
        ledger, [], ended_by="max_updates", dead_letters=0, started_at=0.0, wall_seconds=5.0
    )
    # a dropped update's ε was spent all the same: it counts
    assert summary["device_privacy"] == {
        "worst_epsilon": 4.0,
        "client": "b",
        "delta": 1e-5,
        "devices_reporting": 2,
    }
    console = Console(record=True, width=200)
    print_summary(console, summary, Path("runs/x"))
    shown = console.export_text()
    assert "device DP-SGD, worst ε" in shown
    assert "4 at δ = 1e-05 (b; 2 devices reporting)" in shown


def test_without_device_dpsgd_the_summary_has_no_device_privacy() -> None:
    ledger = [decision(1.0, "applied", "a", 0, version=1)]
    summary = summarize(
        ledger, [], ended_by="max_updates", dead_letters=0, started_at=0.0, wall_seconds=5.0
    )
    assert "device_privacy" not in summary
