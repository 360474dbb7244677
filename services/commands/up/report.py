"""The run folder of `fedasync up`: summary.json, the ledger, the evaluator's curve, the plots.

Read from Redis once every child has stopped, so it is the final word on the run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedasync.services.commands.up import plots
from fedasync.services.commands.up.summary import fairness, summarize
from fedasync.services.commands.up.view import num
from fedasync.services.runtime.redis_conn import connect, get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations, ledger
from fedasync.services.stores.alerts import alert_record
from fedasync.services.stores.keys import Keys
from fedasync.shared.per_class import describe_lagging, lagging_classes


async def write_run_folder(
    settings: Settings, out: Path, *, ended_by: str, wall_seconds: float, extra: dict[str, Any]
) -> dict[str, Any]:
    redis = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        records = [r async for r in ledger.records(redis, keys)]
        curve = await evaluations.all_records(redis, keys)
        dead_letters = int(await redis.xlen(keys.deadletter))
        started = await get_bytes(redis, keys.started)
        raised: Any = await redis.xrange(keys.alerts)
    finally:
        await redis.aclose()
    with (out / "ledger.jsonl").open("w") as file:  # what `fedasync ledger export` writes
        ledger.write_export(records, file)
    started_at = float(started) if started is not None else None
    summary = summarize(
        records,
        curve,
        ended_by=ended_by,
        dead_letters=dead_letters,
        started_at=started_at,
        wall_seconds=wall_seconds,
    )
    summary |= extra
    summary["problems"] = list(summary.get("problems", []))
    if summary["updates"]["applied"] == 0 and ended_by != "interrupted":
        summary["problems"].append("no update was applied (see the dead letters and the logs)")
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
    if lagging:
        table.add_row("[yellow]class not learned[/yellow]", escape(lagging))
    dropped = summary.get("reasons", {}).get("dropped", {})
    why = f" ({', '.join(f'{n} {r}' for r, n in sorted(dropped.items()))})" if dropped else ""
    table.add_row(
        "updates",
        f"{updates['applied']} applied, {updates['dropped']} dropped{why}, "
        f"{updates['rejected']} rejected, {updates['duplicate']} duplicates, "
        f"{updates['dead_letters']} dead letters",
    )
    table.add_row(
        "applied per second",
        f"{num(summary['applied_per_second'], 1)} (from the first applied update to the last)",
    )
    tau, alpha = summary["tau"], summary["alpha"]
    table.add_row(
        "τ p50 / p95 / max",
        f"{num(tau['p50'], 0)} / {num(tau['p95'], 0)} / {num(tau['max'], 0)}",
    )
    table.add_row("α p50 / p95", f"{num(alpha['p50'], 3)} / {num(alpha['p95'], 3)}")
    worst = summary["clients"][:5]
    table.add_row(
        "acceptance, worst first",
        "  ".join(f"{c['client']} {c['rate']:.0%}" for c in worst) or "–",
    )
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
