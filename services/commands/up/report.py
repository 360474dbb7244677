"""The run folder of `fedasync up`: summary.json, the ledger, the evaluator's curve, the plots.

Read from Redis once every child has stopped, so it is the final word on the run.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedasync.services.commands.up import plots
from fedasync.services.commands.up.summary import fairness, spent, summarize
from fedasync.services.commands.up.view import describe_privacy, num
from fedasync.services.control.privacy import privacy_status
from fedasync.services.runtime.redis_conn import as_text, connect, get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations, ledger
from fedasync.services.stores.alerts import alert_record
from fedasync.services.stores.policy_store import read_policy
from fedasync.shared.keys import Keys
from fedasync.shared.per_class import describe_lagging, lagging_classes


async def write_run_folder(
    settings: Settings, out: Path, *, ended_by: str, wall_seconds: float, extra: dict[str, Any]
) -> dict[str, Any]:
    redis = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        records = [r async for r in ledger.records(redis, keys)]
        curve = await evaluations.all_records(redis, keys)
        dead: Any = await redis.xrange(keys.deadletter)
        started = await get_bytes(redis, keys.started)
        raised: Any = await redis.xrange(keys.alerts)
        policy = await read_policy(redis, keys)
    finally:
        await redis.aclose()
    with (out / "ledger.jsonl").open("w") as file:  # what `fedasync ledger export` writes
        ledger.write_export(records, file)
    started_at = float(started) if started is not None else None
    summary = summarize(
        records,
        curve,
        ended_by=ended_by,
        dead_letters=len(dead),
        started_at=started_at,
        wall_seconds=wall_seconds,
        dead_letter_reasons=Counter(as_text(fields.get(b"reason", b"?")) for _, fields in dead),
    )
    privacy = privacy_status(policy, spent(records))
    if privacy is not None:  # a run without DP: the summary it always had
        summary["privacy"] = privacy
    summary |= extra
    summary["problems"] = list(summary.get("problems", []))
    nothing = nothing_applied(summary, settings, out)
    if nothing is not None and ended_by != "interrupted":
        summary["problems"].append(nothing)
    summary["alerts"] = [alert_record(entry_id, fields) for entry_id, fields in raised]
    control = settings.control
    summary["fairness"] = fairness(
        summary["clients"],
        summary["alerts"],
        min_rate=control.fairness_min_rate,
        decisions=control.fairness_decisions,
        enabled="fairness" not in control.disabled_rules,
    )
    _write_curve(curve, out / "evaluations.csv")
    taus = [float(r["tau"]) for r in records if r.get("tau") is not None]
    alphas = [float(r["alpha"]) for r in records if r["outcome"] == "applied" and r.get("alpha")]
    images = [
        plots.accuracy(curve, started_at or 0.0, out),
        plots.histogram(taus, "tau", settings.policy.tau_max, out),
        plots.histogram(alphas, "alpha", settings.policy.tau_max, out),
        plots.acceptance(summary["clients"], out),
    ]
    summary["plots"] = [name for name in images if name is not None]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def nothing_applied(summary: dict[str, Any], settings: Settings, out: Path) -> str | None:
    """Why a run applied no update, in the words of what to do about it; None if it applied
    some. A budget that ran out before any device's first update is not a fault in the logs."""
    updates = summary["updates"]
    if updates["applied"] > 0:
        return None
    if updates["decided"] == 0 and updates["dead_letters"] == 0:
        if summary["ended_by"] == "max_seconds":
            return (
                f"the budget of {settings.budget.max_seconds:g} s ran out before any device's "
                "first update was decided: each device loads its data, fetches version 0 and "
                "trains once first (about half a minute with the defaults), so nothing is in the "
                "logs to look for; give a longer --max-seconds (FEDASYNC_BUDGET__MAX_SECONDS)"
            )
        return f"no device's update reached the aggregator: see the workers' logs in {out / 'logs'}"
    refused = refusals(summary)
    return f"no update was applied: {refused or 'every one was dropped'} (summary.json, the ledger)"


def refusals(summary: dict[str, Any]) -> str:
    """Every refusal by reason: the core's rejections (the ledger's) and what was refused before
    the core decided (the dead letters beyond those), e.g. `921 rejected (921 shape_mismatch)`."""
    rejected = summary.get("reasons", {}).get("rejected", {})
    dead = dict(summary.get("dead_letter_reasons", {}))
    for reason, count in rejected.items():  # the core's rejections are dead letters too
        dead[reason] = dead.get(reason, 0) - count
    before = {reason: count for reason, count in dead.items() if count > 0}
    parts = []
    if rejected:
        parts.append(f"{sum(rejected.values())} rejected ({_by_reason(rejected)})")
    if before:
        parts.append(f"{sum(before.values())} refused before a decision ({_by_reason(before)})")
    return ", ".join(parts)


def _by_reason(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda c: -c[1]))


def _write_curve(curve: list[evaluations.EvaluationRecord], path: Path) -> None:
    classes = sorted({c for r in curve for c in r.per_class}, key=lambda c: (len(c), c))
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            ["version", "committed_at", "evaluated_at", "score", "accuracy", "loss"]
            + [f"class_{c}" for c in classes]
        )
        for r in curve:
            writer.writerow(
                [r.version, r.committed_at, r.at, r.score, r.accuracy, r.loss]
                + [r.per_class.get(c, "") for c in classes]
            )


def print_summary(console: Console, summary: dict[str, Any], out: Path) -> None:
    table = Table(title="fedasync up: summary", show_header=False, title_justify="left")
    final = summary.get("final") or {}
    updates = summary["updates"]
    table.add_row("ended by", summary["ended_by"])
    table.add_row("final version", str(summary["version"]))
    name = "accuracy" if final.get("accuracy") is not None else "score"
    table.add_row(f"final test {name}", num(final.get("score"), 3))
    if final.get("per_class"):
        per_class = "  ".join(f"{c}: {v:.2f}" for c, v in final["per_class"].items())
        table.add_row("per class", per_class)
    lagging = describe_lagging(lagging_classes(final.get("per_class") or {}))
    if lagging and updates["applied"] > 0:  # the initial model's classes say nothing
        table.add_row("[yellow]class not learned[/yellow]", escape(lagging))
    dropped = summary.get("reasons", {}).get("dropped", {})
    why = f" ({', '.join(f'{n} {r}' for r, n in sorted(dropped.items()))})" if dropped else ""
    rejected = summary.get("reasons", {}).get("rejected", {})
    rejected_why = f" ({_by_reason(rejected)})" if rejected else ""
    dead = summary.get("dead_letter_reasons", {})
    dead_why = f" ({_by_reason(dead)})" if dead else ""
    table.add_row(
        "updates",
        f"{updates['applied']} applied, {updates['dropped']} dropped{why}, "
        f"{updates['rejected']} rejected{rejected_why}, {updates['duplicate']} duplicates, "
        f"{updates['dead_letters']} dead letters{dead_why}",
    )
    table.add_row(
        "applied per second",
        f"{num(summary['applied_per_second'], 1)} (from the first applied update to the last)",
    )
    if summary.get("privacy"):
        table.add_row("privacy spent ε", escape(describe_privacy(summary["privacy"])))
    alpha = summary["alpha"]
    for label, tau in (
        ("τ of applied, p50 / p95 / max", summary.get("tau_applied")),
        ("τ of all decided (dropped too)", summary["tau"]),
    ):
        if tau is not None:
            table.add_row(
                label, f"{num(tau['p50'], 0)} / {num(tau['p95'], 0)} / {num(tau['max'], 0)}"
            )
    table.add_row("α p50 / p95", f"{num(alpha['p50'], 3)} / {num(alpha['p95'], 3)}")
    worst = summary["clients"][:5]
    table.add_row(
        "acceptance, worst first",
        "  ".join(f"{c['client']} {c['rate']:.0%}" for c in worst) or "–",
    )
    device_privacy = summary.get("device_privacy")
    if device_privacy:  # the devices trained with DP-SGD
        table.add_row("device DP-SGD, worst ε", describe_device_privacy(device_privacy))
    fair = summary.get("fairness")
    if fair and (fair["alerted"] or fair["below_rate_not_alerted"]):
        table.add_row("fairness alerts", escape(describe_fairness(fair)))
    alerts = summary.get("alerts", [])
    if alerts:
        shown = "; ".join(f"[{a.get('rule')}] {a.get('message')}" for a in alerts[:3])
        more = f" (+{len(alerts) - 3} more in summary.json)" if len(alerts) > 3 else ""
        table.add_row("alerts", escape(shown + more))
    for problem in summary.get("problems", []):
        table.add_row("[red]problem[/red]", escape(problem))
    table.add_row("run folder", str(out))
    console.print(table)


def describe_device_privacy(section: dict[str, Any]) -> str:
    """The worst sample-level ε a device reported, whose, at which δ, and of how many."""
    delta = section.get("delta")
    at = f" at δ = {delta:g}" if delta is not None else ""
    return (
        f"{section['worst_epsilon']:.3g}{at} ({section['client']}; "
        f"{section['devices_reporting']} devices reporting)"
    )


def describe_fairness(fair: dict[str, Any]) -> str:
    """Who the fairness rule alerted on, and why each other client under its rate was not."""
    rate = f"{fair['min_rate']:.0%}"
    parts = [
        f"{', '.join(fair['alerted'])} (each: under {rate} of its last {fair['decisions']} "
        "decided updates applied)"
        if fair["alerted"]
        else "none"
    ]
    parts += [
        f"{c['client']} {c['rate']:.0%} not alerted: {c['why']}"
        for c in fair["below_rate_not_alerted"]
    ]
    return "; ".join(parts)
