"""What a chaos summary says of the exactly-once verdict (services/stores/exactly_once.py).

Both chaos runs count their updates with the same check, the process harness (chaos/report.py)
and the compose stack (chaos/compose/run.py), and a reader compares their summary.json files
field by field: the verdict's figures, checks and examples, and the lines printed of them, are
built here once, so the two say the same thing in the same words. What only one run has (the
harness's server steps and failovers, the compose stack's dead letters) each adds in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedasync.services.stores.exactly_once import Verdict

#: ids shown per failing category in summary.json (all of them are in the ledger export)
EXAMPLES = 20


def update_counts(
    verdict: Verdict, *, stream_entries: int, ledger_records: int, server_steps: int | None = None
) -> dict[str, int]:
    """`updates`: attempted, published, each outcome, (the versions they made,) and what the
    stream and the ledger hold."""
    outcomes = verdict.outcomes
    counts = {
        "attempted": verdict.attempted,
        "published": verdict.acknowledged,
        "applied": outcomes["applied"],
        "dropped": outcomes["dropped"],
        "rejected": outcomes["rejected"],
        "duplicate_skipped": outcomes["duplicate"],
    }
    if server_steps is not None:
        counts["server_steps"] = server_steps
    return counts | {"stream_entries": stream_entries, "ledger_records": ledger_records}


def verdict_counts(
    verdict: Verdict, *, lost_outside_failovers: int | None = None
) -> dict[str, Any]:
    """How many updates fall in each failing category, and the versions' first and last."""
    counts: dict[str, Any] = {"lost": len(verdict.lost)}
    if lost_outside_failovers is not None:
        counts["lost_outside_failovers"] = lost_outside_failovers
    return counts | {
        "duplicated": len(verdict.duplicated),
        "unexpected": len(verdict.unexpected),
        "indeterminate": len(verdict.indeterminate),
        "entries_decided_twice": len(verdict.redecided),
        "entries_undecided": len(verdict.undecided),
        "version_gaps": len(verdict.version_gaps),
        "versions": {"first": verdict.first_version, "last": verdict.last_version},
    }


def verdict_checks(verdict: Verdict, *, lost: bool = True) -> dict[str, bool]:
    """The verdict's checks; `lost`: whether a lost update fails the run (off where the run
    measures what is lost rather than checks it)."""
    return {
        **({"lost == 0": not verdict.lost} if lost else {}),
        "duplicated == 0": not verdict.duplicated,
        "unexpected == 0": not verdict.unexpected,
        "versions contiguous": not verdict.version_gaps,
        "each entry decided once": not (verdict.redecided or verdict.undecided),
    }


def verdict_examples(verdict: Verdict, *, indeterminate: bool = True) -> dict[str, list[Any]]:
    """The first EXAMPLES ids of each failing category (`indeterminate`: those too)."""
    return {
        "lost": verdict.lost[:EXAMPLES],
        "duplicated": verdict.duplicated[:EXAMPLES],
        "unexpected": verdict.unexpected[:EXAMPLES],
        **({"indeterminate": verdict.indeterminate[:EXAMPLES]} if indeterminate else {}),
        "version_gaps": verdict.version_gaps[:EXAMPLES],
        "entries_decided_twice": verdict.redecided[:EXAMPLES],
        "entries_undecided": verdict.undecided[:EXAMPLES],
    }


def served_figures(
    version: int, sha256: str, committed_version: int, committed_sha256: str
) -> dict[str, Any]:
    """`served`: the model the snapshot service serves at the end beside the one committed."""
    return {
        "version": version,
        "sha256": sha256,
        "committed_version": committed_version,
        "committed_sha256": committed_sha256,
    }


# ----------------------------------------------------------------------------- printed lines
def updates_line(u: Mapping[str, Any]) -> str:
    return (
        f"updates: attempted {u['attempted']}, published (acknowledged) {u['published']}, "
        f"applied {u['applied']}, dropped {u['dropped']}, rejected {u['rejected']}, "
        f"duplicate-skipped {u['duplicate_skipped']} "
        f"({u['stream_entries']} stream entries, {u['ledger_records']} ledger records)"
    )


#: the failing categories as verdict_line names them, each with its summary key
_CATEGORIES = (
    ("lost", "lost"),
    ("duplicated", "duplicated"),
    ("unexpected", "unexpected"),
    ("indeterminate", "indeterminate"),
    ("entries decided twice", "entries_decided_twice"),
    ("undecided", "entries_undecided"),
)


def verdict_line(summary: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {summary[key]}" for name, key in _CATEGORIES)


def served_line(served: Mapping[str, Any]) -> str:
    return (
        f"served version {served['version']} sha256 {served['sha256'][:16]}, "
        f"committed version {served['committed_version']} "
        f"sha256 {served['committed_sha256'][:16]}"
    )


def check_lines(summary: Mapping[str, Any], command: str) -> list[str]:
    """Each check PASS or FAIL, then the run's verdict after `command`'s name."""
    lines = [
        f"  [{'PASS' if passed else 'FAIL'}] {name}" for name, passed in summary["checks"].items()
    ]
    lines.append(f"{command}: " + ("all checks passed" if summary["ok"] else "CHECKS FAILED"))
    return lines


def counts_text(counts: Mapping[str, int]) -> str:
    """`kind n, kind n`, or `none`."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
