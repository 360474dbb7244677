"""Per-client acceptance, worst first: one way to count it and one way to show it.

The control service's window keeps each client's last decisions (rules.DecisionWindow),
the end-of-run summary of `fedasync up` counts all of them; both leave duplicates out (a
duplicate says nothing about the client's work, only that a retry arrived twice) and updates
dropped because training had closed (they say how long shutdown took), and both show
the same rows, so a client reads the same on the dashboard and in summary.json.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def closing_drop(record: Mapping[str, Any]) -> bool:
    """An update dropped because training was over: it arrived too late to be judged at all."""
    return record["outcome"] == "dropped" and record.get("reason") == "closed"


def count_acceptance(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """(applied, decided) per client over ledger records, duplicates and closing drops left out;
    the same figures as `DecisionWindow.acceptance` when the window keeps every decision."""
    applied: Counter[str] = Counter()
    decided: Counter[str] = Counter()
    for r in records:
        if r["outcome"] == "duplicate" or closing_drop(r):
            continue
        decided[r["client_id"]] += 1
        applied[r["client_id"]] += r["outcome"] == "applied"
    return {client: (applied[client], n) for client, n in decided.items()}


def acceptance_rows(counts: Mapping[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """{client, applied, decided, rate} per client with a decision, worst rate first, then by
    name (a stable order for equal rates, so the dashboard's table does not shuffle)."""
    rows = [
        {"client": client, "applied": applied, "decided": decided, "rate": applied / decided}
        for client, (applied, decided) in counts.items()
        if decided
    ]
    return sorted(rows, key=lambda row: (row["rate"], row["client"]))
