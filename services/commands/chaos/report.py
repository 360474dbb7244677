"""The run's figures: built once as a plain dict, written to summary.json and printed.

The dict is the contract: the CLI's exit code, the CI test and a reader of summary.json all look
at the same `checks` entries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos import verdict_report
from fedasync.services.commands.chaos.audit import Audit
from fedasync.services.commands.chaos.faults import Injector
from fedasync.services.commands.chaos.probe import Backlog, LagAtRest, Served
from fedasync.services.commands.chaos.schedule import FaultKind, Profile, durable_label
from fedasync.services.commands.chaos.waits import Waits, xadd_time
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.services.stores.exactly_once import Verdict

#: what a service logs when it hears of a failover and drops the old primary
SWITCH_HEARD = "the Sentinels switched the primary"


def first_commits(failovers: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Add to each failover the seconds from the kill to the first commit on the new primary.

    A commit's ledger entries carry the time the new primary added them (the entry id, on the
    host's one clock): the first entry after the kill is the first commit there."""
    times = sorted(xadd_time(str(record["ledger_id"])) for record in records)
    for failover in failovers:
        after = [t for t in times if t >= failover["wall"]]
        failover["first_commit_s"] = round(after[0] - failover["wall"], 3) if after else None


def switches_heard(logs: Path) -> int:
    """Log lines of the services that heard `+switch-master` and dropped the old primary
    (services/runtime/primary_watch.py)."""
    count = 0
    for path in sorted(logs.glob("*.log")):
        with path.open(errors="replace") as lines:
            count += sum(SWITCH_HEARD in line for line in lines)
    return count


#: a lost update belongs to the last loss of the primary that began at most this long after
#: its XADD: a kill takes what was acknowledged just before it, a resumed primary what it took
#: after its resume (chaos/faults.py), seconds
LOSS_LEAD_S = 2.0


def attribute_lost(failovers: list[dict[str, Any]], lost_added: Sequence[float]) -> int:
    """Set each failover's `lost`: the lost updates (by their XADD times) it explains, the last
    one that began no later than LOSS_LEAD_S after each; returns those none explains."""
    return attribute(failovers, lost_added, "lost")


def attribute(failovers: list[dict[str, Any]], added: Sequence[float], name: str) -> int:
    """Count each update (by its XADD time) into `name` of the failover it belongs to, the last
    one that began no later than LOSS_LEAD_S after it; returns those that belong to none.

    One rule for every figure of a failover's row: the updates a loss is blamed on
    (`attribute_lost`), and those it put at risk, which a cluster's row counts beside them
    (chaos/cluster_report.py), so that a row's lost updates are always among its own."""
    for failover in failovers:
        failover[name] = 0
    outside = 0
    for at in added:
        before = [f for f in failovers if f["wall"] <= at + LOSS_LEAD_S]
        if before:
            max(before, key=lambda f: f["wall"])[name] += 1
        else:
            outside += 1
    return outside


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
    lag: LagAtRest,
    audit: Audit,
    verdict: Verdict,
    waits: Waits,
    malformed_journal_lines: int,
    acl_refusals: list[str] | None = None,
    policy: dict[str, str] | None = None,
    acknowledged: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`acl_refusals`: what the ACL refused on every server and Sentinel (replicated); None:
    the audit's reading of the one server. `acknowledged`: update id → the entry id its XADD
    returned (the journals)."""
    refused = audit.refused if acl_refusals is None else acl_refusals
    failovers = [f.to_dict() for f in injector.failovers]
    first_commits(failovers, audit.records)
    entries = acknowledged or {}
    lost_unexplained = attribute_lost(
        failovers, [xadd_time(entries[u]) for u in verdict.lost if u in entries]
    )
    moved_back = sum(f["moved_back"] for f in failovers)
    checks = {
        **_checks(
            profile,
            injector,
            audit=audit,
            verdict=verdict,
            drained=drained,
            served=served,
            lag=lag,
            waits=waits,
            malformed_journal_lines=malformed_journal_lines,
            refused=refused,
        ),
        **_failover_checks(profile, failovers, moved_back),
    }
    return {
        **_run_figures(profile, seed, out, duration_s, policy),
        **_fault_figures(injector),
        "updates": updates_figures(verdict, audit),
        **verdict_report.verdict_counts(verdict, lost_outside_failovers=lost_unexplained),
        **waits_and_verify(waits, audit),
        "served": verdict_report.served_figures(
            served.served_version,
            served.served_sha256,
            served.committed_version,
            served.committed_sha256,
        ),
        **at_rest(backlog, lag),
        "redis_restarts": [check.to_dict() for check in injector.restarts],
        "failovers": failovers,
        "versions_moved_back": moved_back,
        "aggregator_refusals": sum(injector.refusals.values()),
        "snapshot_unfrozen": injector.unfrozen,
        "alerts": dict(sorted(audit.alerts.items())),
        "acl_refusals": refused[: verdict_report.EXAMPLES],
        "examples": {
            **verdict_report.verdict_examples(verdict),
            "waits_over_bound": waits.over[: verdict_report.EXAMPLES],
        },
        "checks": checks,
        "ok": all(checks.values()),
        "events": [event.to_dict() for event in injector.events],
    }


def updates_figures(verdict: Verdict, audit: Audit) -> dict[str, int]:
    """The `updates` figures, with the server steps the ledger records."""
    return verdict_report.update_counts(
        verdict,
        # the versions they made: every applied update in FedAsync, one per K in the others
        server_steps=sum(
            1 for r in audit.records if r["outcome"] == "applied" and r.get("server_step", True)
        ),
        stream_entries=len(audit.entry_ids),
        ledger_records=len(audit.records),
    )


def waits_and_verify(waits: Waits, audit: Audit) -> dict[str, Any]:
    """The longest XADD→decision wait against its bound, and `ledger verify`'s answer."""
    return {
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
    }


def _durable(profile: Profile) -> bool:
    """Off, durable mode's guarantees are what the run measures, not what it checks."""
    return not profile.replicated or profile.durable_replicas != 0


def _checks(
    profile: Profile,
    injector: Injector,
    *,
    audit: Audit,
    verdict: Verdict,
    drained: bool,
    served: Served,
    lag: LagAtRest,
    waits: Waits,
    malformed_journal_lines: int,
    refused: list[str],
) -> dict[str, bool]:
    """The checks every profile makes: the `checks` entries the exit code and CI read."""
    scheduled = {kind.value for kind, count in profile.faults if count > 0}
    restarts = injector.restarts
    alarms = {rule: audit.alerts[rule] for rule in (STATE_MISMATCH, VERSION_REGRESSED)}
    durable = _durable(profile)
    return {
        "every fault kind injected": all(injector.injected[k] > 0 for k in scheduled),
        "stream drained": drained,
        **verdict_report.verdict_checks(verdict, lost=durable),
        "ledger verify passes": audit.verify.ok,
        "served == committed": served.equal,
        "lag at rest == 0": lag.metric == 0,
        "journals intact": malformed_journal_lines == 0,
        "state, model and ledger intact after every Redis restart": (
            len(restarts) == injector.injected[FaultKind.KILL_REDIS.value]
            and all(check.intact for check in restarts)
        ),
        **({"no move back in time alarmed": not any(alarms.values())} if durable else {}),
        "no command refused by Redis's ACL": not refused,
        "XADD→decision waits within the bound": waits.ok,
        "slow clients cut off by the snapshot service": all(
            b.opened > 0 and b.closed_by_server == b.opened for b in injector.bursts
        ),
    }


def _failover_checks(
    profile: Profile, failovers: list[dict[str, Any]], moved_back: int
) -> dict[str, bool]:
    """A replicated profile's checks of its failovers (none for one server)."""
    if not profile.replicated:
        return {}
    checks = {
        "every failover promoted a replica": all(
            f["new_port"] is not None and not f["problems"] for f in failovers
        )
    }
    if _durable(profile):
        checks["no version moved back"] = moved_back == 0
    return checks


def _run_figures(
    profile: Profile, seed: int, out: Path, duration_s: float, policy: dict[str, str] | None
) -> dict[str, Any]:
    """What ran: the profile, its Redis, the seed and the policy, where and how long."""
    return {
        "profile": profile.name,
        "label": profile.label,
        "replicated": profile.replicated,
        "durable_replicas": profile.durable_replicas,
        "durable_label": durable_label(profile),
        # the services' log lines saying they closed their connections to a replaced primary
        "switches_heard": switches_heard(out / "logs"),
        "replica_lag_ms": profile.replica_lag_ms,
        "seed": seed,
        "acl": profile.acl,
        "policy": policy or {},
        "out": str(out),
        "duration_s": round(duration_s, 1),
    }


def _fault_figures(injector: Injector) -> dict[str, Any]:
    """The faults injected and skipped, the exits nobody asked for, the slow clients' bursts."""
    return {
        "faults": dict(sorted(injector.injected.items())),
        "faults_skipped": dict(sorted(injector.skipped.items())),
        "unexpected_exits": dict(sorted(injector.crashes.items())),
        "slow_clients": [
            {"opened": b.opened, "closed_by_server": b.closed_by_server, "seconds": b.seconds}
            for b in injector.bursts
        ],
    }


def at_rest(backlog: Backlog, lag: LagAtRest) -> dict[str, Any]:
    """The stream and the lag once the run is over."""
    return {
        "backlog_at_end": {
            "entries": backlog.entries,
            "pending": backlog.pending,
            "last_id": backlog.last_id,
            "delivered_up_to": backlog.delivered_up_to,
        },
        "lag_at_rest": {
            "aggregator": lag.metric,
            "redis": lag.redis,
            "corrected": list(lag.corrected),
        },
    }


def write_summary(out: Path, summary: Mapping[str, Any]) -> Path:
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def describe(summary: Mapping[str, Any]) -> str:
    """The figures a person reads after a run, one topic per line."""
    u = summary["updates"]
    versions = summary["versions"]
    waits = summary["waits"]
    lines = [
        f"chaos run: profile {summary.get('label', summary['profile'])}, seed {summary['seed']}, "
        f"{summary['duration_s']} s, logs and summary.json in {summary['out']}",
        "policy: " + (", ".join(f"{k} {v}" for k, v in summary["policy"].items()) or "the default"),
        acl_line(summary),
        "faults injected: " + verdict_report.counts_text(summary["faults"]),
        "faults skipped: " + verdict_report.counts_text(summary["faults_skipped"]),
        "unexpected exits (restarted): " + verdict_report.counts_text(summary["unexpected_exits"]),
        verdict_report.updates_line(u),
        verdict_report.verdict_line(summary),
        f"versions {versions['first']}..{versions['last']} ({u['server_steps']} server steps), "
        f"{summary['version_gaps']} breaks in the sequence",
        f"longest XADD→decision wait {waits['longest_s']:.2f} s (entry {waits['longest_entry']}); "
        f"bound {waits['bound_s']:.2f} s plus the faults overlapping a wait; "
        f"{waits['over_bound']} over",
        verdict_report.served_line(summary["served"]),
        summary["verify"]["text"],
        _lag_line(summary["lag_at_rest"]),
        *_restarts(summary["redis_restarts"]),
        *_failovers(summary),
        "slow clients against the snapshot service: "
        + (
            "; ".join(
                f"{b['opened']} opened, {b['closed_by_server']} closed by the server within "
                f"{b['seconds']:.1f} s"
                for b in summary["slow_clients"]
            )
            or "none"
        ),
        "alerts: " + verdict_report.counts_text(summary["alerts"]),
        refusals_line(summary["acl_refusals"]),
        *verdict_report.check_lines(summary, "chaos"),
    ]
    return "\n".join(lines)


def acl_line(summary: Mapping[str, Any]) -> str:
    """Whether the run's Redis was under the ACL file."""
    return "Redis " + (
        "under the ACL file, each service as its own user"
        if summary["acl"]
        else "without an ACL (every service as the default user)"
    )


def refusals_line(refused: Sequence[str]) -> str:
    return "commands refused by the ACL: " + ("; ".join(refused) if refused else "none")


def _lag_line(lag: Mapping[str, Any]) -> str:
    corrected = ", ".join(map(str, lag["corrected"]))
    drift = (
        f"Redis's drifted figure corrected {len(lag['corrected'])} times ({corrected})"
        if corrected
        else "Redis's figure never needed correcting"
    )
    return f"lag at rest: aggregator {lag['aggregator']}, Redis {lag['redis']}; {drift}"


def _failovers(summary: Mapping[str, Any]) -> list[str]:
    """One line per kill of the primary (replicated profiles only)."""
    if not summary.get("replicated"):
        return []
    lines = [
        f"failovers: {len(summary['failovers'])}, versions moved back "
        f"{summary['versions_moved_back']}, aggregator refusals (exit 4, restarted) "
        f"{summary['aggregator_refusals']}, snapshot service restarted after freezing "
        f"{summary['snapshot_unfrozen']}"
    ]
    for f in summary["failovers"]:
        paused = f.get("how") == "pause"
        lost = f"paused {seconds_text(f.get('frozen_s'))}" if paused else "killed"
        resumed = f", {f.get('version_resumed')} after its resume" if paused else ""
        lines.append(
            f"  t={f['at']:7.2f} s: primary 127.0.0.1:{f['old_port']} {lost}, "
            f"127.0.0.1:{f['new_port']} promoted after {seconds_text(f['promoted_s'])}, first "
            f"commit there after {seconds_text(f.get('first_commit_s'))}; version announced "
            f"{f['version_before']}{resumed} → committed {f['version_after']}"
            + ("; " + "; ".join(f["problems"]) if f["problems"] else "")
        )
    return lines


def seconds_text(value: float | None) -> str:
    """Seconds to two places, `?` when unknown (a failover with no reading)."""
    return "?" if value is None else f"{value:.2f} s"


def failover_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Durable mode off, on and as shipped, each loss of the primary (kill -9, pause and
    resume) on its own row: the figures of `fedasync chaos --profile failover`."""

    def spread(values: list[float | None]) -> str:
        known = sorted(v for v in values if v is not None)
        if not known:
            return "?"
        return f"{known[len(known) // 2]:.2f} / {known[-1]:.2f}"

    out = [
        "| durable mode | fault | faults | acknowledged (run) | lost | decided twice (run) "
        "| versions moved back | promotion, s (median / max) "
        "| next commit after the fault, s (median / max) | checks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for how, name in (("kill", "kill -9 of the primary"), ("pause", "pause, then resume")):
            rows = [f for f in s["failovers"] if f.get("how", "kill") == how]
            if not rows:
                continue
            cells = [
                durable_mode(s),
                name,
                len(rows),
                s["updates"]["published"],
                sum(f.get("lost", 0) for f in rows),
                s["duplicated"] + s["entries_decided_twice"],
                sum(f["moved_back"] for f in rows),
                spread([f["promoted_s"] for f in rows]),
                spread([f.get("first_commit_s") for f in rows]),
                "pass" if s["ok"] else "FAIL",
            ]
            out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def durable_mode(summary: Mapping[str, Any]) -> str:
    label = summary.get("durable_label")
    if label:
        return str(label)
    n = summary.get("durable_replicas", 0)
    return f"durable on (WAIT {n})" if n else "durable off"


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
