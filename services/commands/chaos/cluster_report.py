"""The cluster failover audit's figures: one row per kill and run, and each run's verdict.

Built once as a plain dict (summary.json, the exit code and the test read the same `checks`),
from the same pieces the Sentinel audit's report uses (chaos/report.py): a row is a
`faults.Failover` of one run, its first commit after the kill found in the run's ledger
(`first_commits`), its lost updates blamed on it by their XADD times (`attribute`, the rule of
`attribute_lost`), and beside them, by the same rule, the updates acknowledged in its window
and those decided twice. A victim's row reads its slot's old primary and the promoted replica;
a bystander's reads its own primary, which the kill did not touch, so its next commit shows
whether the kill held it up at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos import verdict_report
from fedasync.services.commands.chaos.cluster_failover import ClusterInjector, RunResult
from fedasync.services.commands.chaos.report import (
    acl_line,
    at_rest,
    attribute,
    attribute_lost,
    durable_mode,
    first_commits,
    refusals_line,
    seconds_text,
    updates_figures,
    waits_and_verify,
)
from fedasync.services.commands.chaos.schedule import FaultKind, Profile, durable_label
from fedasync.services.commands.chaos.waits import xadd_time
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.services.stores.exactly_once import Verdict


def row_figures(
    rows: list[dict[str, Any]],
    records: list[dict[str, Any]],
    acknowledged: Mapping[str, str],
    verdict: Verdict,
) -> int:
    """Fill in one run's rows (its Failover dicts, in kill order): `first_commit_s` from its
    ledger `records`, and by XADD time `acknowledged`, `lost` and `decided_twice`, each update
    in the row of the last kill before it (`attribute`). Returns the lost updates no kill
    explains. Pure: unit-tested."""
    first_commits(rows, records)
    attribute(rows, [xadd_time(entry) for entry in acknowledged.values()], "acknowledged")
    lost = attribute_lost(
        rows, [xadd_time(acknowledged[u]) for u in verdict.lost if u in acknowledged]
    )
    twice = [xadd_time(acknowledged[u]) for u in verdict.duplicated if u in acknowledged]
    attribute(rows, twice + [xadd_time(entry) for entry in verdict.redecided], "decided_twice")
    return lost


def _durable(profile: Profile) -> bool:
    return profile.durable_replicas != 0


def run_summary(
    profile: Profile, result: RunResult, rows: list[dict[str, Any]], injector: ClusterInjector
) -> dict[str, Any]:
    """One run's figures and checks, its rows filled in."""
    verdict, audited, rest = result.verdict, result.audit, result.at_rest
    lost_outside = row_figures(rows, audited.records, result.journals.acknowledged, verdict)
    moved_back = sum(r["moved_back"] for r in rows)
    alarms = {rule: audited.alerts[rule] for rule in (STATE_MISMATCH, VERSION_REGRESSED)}
    durable = _durable(profile)
    checks = {
        "stream drained": rest.drained,
        **verdict_report.verdict_checks(verdict, lost=durable),
        "ledger verify passes": audited.verify.ok,
        "served == committed": rest.served.equal,
        "lag at rest == 0": rest.lag.metric == 0,
        "journals intact": result.journals.malformed == 0,
        "committed after every kill": all(r["first_commit_s"] is not None for r in rows),
        **(
            {
                "no version moved back": moved_back == 0,
                "no move back in time alarmed": not any(alarms.values()),
            }
            if durable
            else {}
        ),
        "XADD→decision waits within the bound": result.waits.ok,
    }
    names = [result.run.aggregator, *result.run.workers]
    return {
        "run": result.run.id,
        "default": result.run.default,
        "updates": updates_figures(verdict, audited),
        **verdict_report.verdict_counts(verdict, lost_outside_failovers=lost_outside),
        **waits_and_verify(result.waits, audited),
        "served": verdict_report.served_figures(
            rest.served.served_version,
            rest.served.served_sha256,
            rest.served.committed_version,
            rest.served.committed_sha256,
        ),
        **at_rest(rest.backlog, rest.lag),
        "versions_moved_back": moved_back,
        "victim_of": sum(r["role"] == "victim" for r in rows),
        "unexpected_exits": {n: injector.crashes[n] for n in names if injector.crashes[n]},
        "aggregator_refusals": injector.refusals[result.run.aggregator],
        "alerts": dict(sorted(audited.alerts.items())),
        "examples": verdict_report.verdict_examples(verdict),
        "checks": checks,
        "ok": all(checks.values()),
    }


def build_summary(
    *,
    profile: Profile,
    seed: int,
    out: Path,
    duration_s: float,
    injector: ClusterInjector,
    results: list[RunResult],
    open_to_default: Sequence[int] = (),
) -> dict[str, Any]:
    """The run's summary: the kills, one row per kill and run, each run's verdict, the checks.
    `open_to_default`: the nodes that answered a client that never logged in, at the start or
    the end."""
    kills = [kill.to_dict() for kill in injector.kills]
    failovers = [f.to_dict() for f in injector.failovers]
    runs = []
    for result in results:
        rows = [f for f in failovers if f["run"] == result.run.id]
        runs.append(run_summary(profile, result, rows, injector))
    scheduled = sum(count for kind, count in profile.faults if kind is FaultKind.FAILOVER)
    victims = {run for kill in kills for run in kill["victims"]}
    checks = {
        "every scheduled kill injected": len(kills) == scheduled,
        "every kill a SIGKILL of the slot's primary (exit -9)": all(
            k["exit_code"] == -9 and k["victims"] for k in kills
        ),
        "every kill promoted a replica": all(
            k["new_port"] not in (None, k["old_port"]) and not k["problems"] for k in kills
        ),
        **(
            {"every run's primary killed": victims == {r["run"] for r in runs}}
            if len(kills) >= len(runs)
            else {}
        ),
        **_acl_checks(profile, injector, open_to_default),
        **{f"{r['run']}: {name}": passed for r in runs for name, passed in r["checks"].items()},
    }
    return {
        "profile": profile.name,
        "label": profile.label,
        "cluster": True,
        "durable_replicas": profile.durable_replicas,
        "durable_label": durable_label(profile),
        "seed": seed,
        "acl": profile.acl,
        "acl_refusals": injector.acl_refused[: verdict_report.EXAMPLES],
        "failed_logins": injector.failed_logins[: verdict_report.EXAMPLES],
        "acl_log_unread": injector.acl_log_unread,
        "open_to_default": list(open_to_default),
        #: child → the Redis user it logs in as
        "users": {name: injector.system.user_of(name) for name in injector.system.children},
        "out": str(out),
        "duration_s": round(duration_s, 1),
        "workers_per_run": profile.workers,
        "faults": dict(sorted(injector.injected.items())),
        "faults_skipped": dict(sorted(injector.skipped.items())),
        "unexpected_exits": dict(sorted(injector.crashes.items())),
        "kills": kills,
        "failovers": failovers,
        "runs": runs,
        "checks": checks,
        "ok": all(checks.values()),
        "events": [event.to_dict() for event in injector.events],
    }


def _acl_checks(
    profile: Profile, injector: ClusterInjector, open_to_default: Sequence[int]
) -> dict[str, bool]:
    """Nothing refused on any node (the killed ones read before their kill); under the ACL,
    also no login refused, every log read, and the ACL really on: no node let in a client that
    did not log in."""
    checks = {"no command refused by Redis's ACL": not injector.acl_refused}
    if profile.acl:
        checks |= {
            "no login refused by Redis's ACL": not injector.failed_logins,
            "every node's ACL LOG read": not injector.acl_log_unread,
            "every node turns away a client that does not log in": not open_to_default,
        }
    return checks


def cluster_failover_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """One row per kill and run, for each durable mode: the figures of `fedasync chaos
    --profile cluster-failover` (the columns of `failover_table`, per row)."""
    out = [
        "| durable mode | kill | primary killed → promoted | run | role | acknowledged "
        "| lost | decided twice | versions moved back | promotion, s | next commit, s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for number, kill in enumerate(s["kills"], 1):
            rows = [f for f in s["failovers"] if f["wall"] == kill["wall"]]
            for row in rows:
                cells = [
                    durable_mode(s),
                    number,
                    f"{kill['old_port']} → {kill['new_port'] or '?'}",
                    row["run"],
                    row["role"],
                    row.get("acknowledged", "?"),
                    row.get("lost", "?"),
                    row.get("decided_twice", "?"),
                    row["moved_back"],
                    seconds_text(row["promoted_s"]).removesuffix(" s"),
                    seconds_text(row.get("first_commit_s")).removesuffix(" s"),
                ]
                out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def describe(summary: Mapping[str, Any]) -> str:
    """The figures a person reads after a run: the kills, then each run, then the checks."""
    lines = [
        f"chaos run: profile {summary['label']}, seed {summary['seed']}, "
        f"{summary['duration_s']} s, {summary['workers_per_run']} workers per run, logs and "
        f"summary.json in {summary['out']}",
        "faults injected: " + verdict_report.counts_text(summary["faults"]),
        "faults skipped: " + verdict_report.counts_text(summary["faults_skipped"]),
        "unexpected exits (restarted): " + verdict_report.counts_text(summary["unexpected_exits"]),
        acl_line(summary),
    ]
    for k in summary["kills"]:
        lines.append(
            f"  t={k['at']:7.2f} s: primary 127.0.0.1:{k['old_port']} (of "
            f"{', '.join(k['victims'])}) killed, exit {k['exit_code']}; 127.0.0.1:{k['new_port']} "
            f"promoted after {seconds_text(k['promoted_s'])}, the killed node back after "
            f"{seconds_text(k['restarted_s'])}"
            + ("; " + "; ".join(k["problems"]) if k["problems"] else "")
        )
    for r in summary["runs"]:
        lines += [
            f"run {r['run']}{' (default)' if r['default'] else ''}: victim of {r['victim_of']} "
            f"kills, refusals (exit 4, restarted) {r['aggregator_refusals']}",
            "  " + verdict_report.updates_line(r["updates"]),
            "  " + verdict_report.verdict_line(r),
            "  " + verdict_report.served_line(r["served"]),
            "  " + r["verify"]["text"],
        ]
    lines += [
        refusals_line(summary["acl_refusals"]),
        "logins refused by the ACL: " + ("; ".join(summary["failed_logins"]) or "none"),
    ]
    lines += verdict_report.check_lines(summary, "chaos")
    return "\n".join(lines)
