"""The run's figures: built once as a plain dict, written to summary.json and printed.

The dict is the contract: the CLI's exit code, the CI test and a reader of summary.json all look
at the same `checks` entries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos.audit import Audit
from fedasync.services.commands.chaos.faults import Injector
from fedasync.services.commands.chaos.probe import Backlog, Served
from fedasync.services.commands.chaos.schedule import FaultKind, Profile
from fedasync.services.commands.chaos.waits import Waits
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.services.stores.exactly_once import Verdict

#: ids shown per failing category in summary.json (all of them are in the ledger export)
EXAMPLES = 20


def build_summary(
    *,
    profile: Profile,
    seed: int,
    out: Path,
    duration_s: float,
    injector: Injector,
    drained: bool,
    backlog: Backlog,
    served: Served,
    audit: Audit,
    verdict: Verdict,
    waits: Waits,
    malformed_journal_lines: int,
    policy: dict[str, str] | None = None,
) -> dict[str, Any]:
    scheduled = {kind.value for kind, count in profile.faults if count > 0}
    outcomes = verdict.outcomes
    restarts = injector.restarts
    alarms = {rule: audit.alerts[rule] for rule in (STATE_MISMATCH, VERSION_REGRESSED)}
    checks = {
        "every fault kind injected": all(injector.injected[k] > 0 for k in scheduled),
        "stream drained": drained,
        "lost == 0": not verdict.lost,
        "duplicated == 0": not verdict.duplicated,
        "unexpected == 0": not verdict.unexpected,
        "versions contiguous": not verdict.version_gaps,
        "each entry decided once": not (verdict.redecided or verdict.undecided),
        "ledger verify passes": audit.verify.ok,
        "served == committed": served.equal,
        "journals intact": malformed_journal_lines == 0,
        "state, model and ledger intact after every Redis restart": (
            len(restarts) == injector.injected[FaultKind.KILL_REDIS.value]
            and all(check.intact for check in restarts)
        ),
        "no move back in time alarmed": not any(alarms.values()),
        "no command refused by Redis's ACL": not audit.refused,
        "XADD→decision waits within the bound": waits.ok,
        "slow clients cut off by the snapshot service": all(
            b.opened > 0 and b.closed_by_server == b.opened for b in injector.bursts
        ),
    }
    return {
        "profile": profile.name,
        "seed": seed,
        "acl": profile.acl,
        "policy": policy or {},
        "out": str(out),
        "duration_s": round(duration_s, 1),
        "faults": dict(sorted(injector.injected.items())),
        "faults_skipped": dict(sorted(injector.skipped.items())),
        "unexpected_exits": dict(sorted(injector.crashes.items())),
        "slow_clients": [
            {"opened": b.opened, "closed_by_server": b.closed_by_server, "seconds": b.seconds}
            for b in injector.bursts
        ],
        "updates": {
            "attempted": verdict.attempted,
            "published": verdict.acknowledged,
            "applied": outcomes["applied"],
            "dropped": outcomes["dropped"],
            "rejected": outcomes["rejected"],
            "duplicate_skipped": outcomes["duplicate"],
            # the versions they made: every applied update in FedAsync, one per K in the others
            "server_steps": sum(
                1 for r in audit.records if r["outcome"] == "applied" and r.get("server_step", True)
            ),
            "stream_entries": len(audit.entry_ids),
            "ledger_records": len(audit.records),
        },
        "lost": len(verdict.lost),
        "duplicated": len(verdict.duplicated),
        "unexpected": len(verdict.unexpected),
        "indeterminate": len(verdict.indeterminate),
        "entries_decided_twice": len(verdict.redecided),
        "entries_undecided": len(verdict.undecided),
        "version_gaps": len(verdict.version_gaps),
        "versions": {"first": verdict.first_version, "last": verdict.last_version},
        "waits": {
            "longest_s": round(waits.longest_s, 3),
            "longest_entry": waits.longest_entry,
            "bound_s": waits.bound_s,
            "over_bound": len(waits.over),
        },
        "verify": {
            "ok": audit.verify.ok,
            "replayed": audit.verify.replayed,
            "version": audit.verify.version,
            "text": audit.verify.describe(),
        },
        "served": {
            "version": served.served_version,
            "sha256": served.served_sha256,
            "committed_version": served.committed_version,
            "committed_sha256": served.committed_sha256,
        },
        "backlog_at_end": {
            "entries": backlog.entries,
            "pending": backlog.pending,
            "last_id": backlog.last_id,
            "delivered_up_to": backlog.delivered_up_to,
        },
        "redis_restarts": [check.to_dict() for check in restarts],
        "alerts": dict(sorted(audit.alerts.items())),
        "acl_refusals": audit.refused[:EXAMPLES],
        "examples": {
            "lost": verdict.lost[:EXAMPLES],
            "duplicated": verdict.duplicated[:EXAMPLES],
            "unexpected": verdict.unexpected[:EXAMPLES],
            "indeterminate": verdict.indeterminate[:EXAMPLES],
            "version_gaps": verdict.version_gaps[:EXAMPLES],
            "entries_decided_twice": verdict.redecided[:EXAMPLES],
            "entries_undecided": verdict.undecided[:EXAMPLES],
            "waits_over_bound": waits.over[:EXAMPLES],
        },
        "checks": checks,
        "ok": all(checks.values()),
        "events": [event.to_dict() for event in injector.events],
    }


def write_summary(out: Path, summary: Mapping[str, Any]) -> Path:
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def describe(summary: Mapping[str, Any]) -> str:
    """The figures a person reads after a run, one topic per line."""
    u = summary["updates"]
    served = summary["served"]
    versions = summary["versions"]
    waits = summary["waits"]
    lines = [
        f"chaos run: profile {summary['profile']}, seed {summary['seed']}, "
        f"{summary['duration_s']} s, logs and summary.json in {summary['out']}",
        "policy: "
        + (", ".join(f"{k} {v}" for k, v in summary["policy"].items()) or "the default"),
        "Redis "
        + (
            "under the ACL file, each service as its own user"
            if summary["acl"]
            else "without an ACL (every service as the default user)"
        ),
        "faults injected: " + _counts(summary["faults"]),
        "faults skipped: " + _counts(summary["faults_skipped"]),
        "unexpected exits (restarted): " + _counts(summary["unexpected_exits"]),
        f"updates: attempted {u['attempted']}, published (acknowledged) {u['published']}, "
        f"applied {u['applied']}, dropped {u['dropped']}, rejected {u['rejected']}, "
        f"duplicate-skipped {u['duplicate_skipped']} "
        f"({u['stream_entries']} stream entries, {u['ledger_records']} ledger records)",
        f"lost {summary['lost']}, duplicated {summary['duplicated']}, "
        f"unexpected {summary['unexpected']}, indeterminate {summary['indeterminate']}, "
        f"entries decided twice {summary['entries_decided_twice']}, "
        f"undecided {summary['entries_undecided']}",
        f"versions {versions['first']}..{versions['last']} ({u['server_steps']} server steps), "
        f"{summary['version_gaps']} breaks in the sequence",
        f"longest XADD→decision wait {waits['longest_s']:.2f} s (entry {waits['longest_entry']}); "
        f"bound {waits['bound_s']:.2f} s plus the faults overlapping a wait; "
        f"{waits['over_bound']} over",
        f"served version {served['version']} sha256 {served['sha256'][:16]}, "
        f"committed version {served['committed_version']} "
        f"sha256 {served['committed_sha256'][:16]}",
        summary["verify"]["text"],
        *_restarts(summary["redis_restarts"]),
        "slow clients against the snapshot service: "
        + (
            "; ".join(
                f"{b['opened']} opened, {b['closed_by_server']} closed by the server within "
                f"{b['seconds']:.1f} s"
                for b in summary["slow_clients"]
            )
            or "none"
        ),
        "alerts: " + _counts(summary["alerts"]),
        "commands refused by the ACL: "
        + ("; ".join(summary["acl_refusals"]) if summary["acl_refusals"] else "none"),
    ]
    lines += [
        f"  [{'PASS' if passed else 'FAIL'}] {name}" for name, passed in summary["checks"].items()
    ]
    lines.append("chaos: " + ("all checks passed" if summary["ok"] else "CHECKS FAILED"))
    return "\n".join(lines)


def _restarts(restarts: list[dict[str, Any]]) -> list[str]:
    """One line per Redis kill: the readings before → after, and what did not survive."""
    intact = sum(r["intact"] for r in restarts)
    lines = [f"Redis restarts: {len(restarts)}, intact {intact}"]
    for r in restarts:
        figures = ", ".join(
            f"{name} {r[key][0]}→{r[key][1]}"
            for name, key in (
                ("commit", "commit_seq"),
                ("version", "version"),
                ("ledger", "ledger"),
                ("updates", "updates"),
                ("group delivered", "delivered"),
            )
        )
        verdict = "intact" if r["intact"] else "DAMAGED: " + "; ".join(r["problems"])
        lines.append(f"  t={r['at']:7.2f} s: {figures}: {verdict}")
    return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
