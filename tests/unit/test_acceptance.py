"""Per-client acceptance: counted once (duplicates out), shown once (worst first, then by name),
and the same figures as the control service's DecisionWindow when it keeps every decision."""

from __future__ import annotations

import random
from typing import Any

from fedasync.shared.acceptance import acceptance_rows, count_acceptance
from fedasync.shared.rules import DecisionWindow

OUTCOMES = ("applied", "dropped", "rejected", "duplicate")


def records(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"client_id": f"c{rng.randrange(6)}", "outcome": rng.choice(OUTCOMES), "at": float(i)}
        for i in range(n)
    ]


def test_duplicates_are_left_out_of_the_counts() -> None:
    ledger = [
        {"client_id": "a", "outcome": "applied"},
        {"client_id": "a", "outcome": "duplicate"},
        {"client_id": "a", "outcome": "dropped"},
        {"client_id": "b", "outcome": "duplicate"},
    ]
    assert count_acceptance(ledger) == {"a": (1, 2)}  # b decided nothing: no row


def test_rows_are_worst_first_then_by_name() -> None:
    rows = acceptance_rows({"fast": (9, 10), "slow-b": (1, 4), "slow-a": (2, 8), "new": (1, 1)})
    assert [(r["client"], r["rate"]) for r in rows] == [
        ("slow-a", 0.25),
        ("slow-b", 0.25),
        ("fast", 0.9),
        ("new", 1.0),
    ]
    assert rows[0] == {"client": "slow-a", "applied": 2, "decided": 8, "rate": 0.25}


def test_the_window_and_the_ledger_count_the_same_way() -> None:
    """The dashboard (DecisionWindow) and summary.json (the whole ledger) agree on every client
    when the window keeps all decisions: duplicates are left out by both."""
    for seed in range(5):
        ledger = records(seed, 300)
        window = DecisionWindow(window_s=1e9, per_client=len(ledger))
        for r in ledger:
            window.add(r["at"], r["outcome"], r["client_id"], None, None)
        assert window.acceptance() == count_acceptance(ledger)
        assert acceptance_rows(window.acceptance()) == acceptance_rows(count_acceptance(ledger))


def test_updates_dropped_after_training_closed_do_not_count() -> None:
    ledger = [
        {"outcome": "applied", "client_id": "a", "reason": None},
        {"outcome": "dropped", "client_id": "a", "reason": "stale"},
        {"outcome": "dropped", "client_id": "a", "reason": "closed"},
        {"outcome": "dropped", "client_id": "b", "reason": "closed"},
    ]
    assert count_acceptance(ledger) == {"a": (1, 2)}
