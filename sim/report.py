"""report.md: the run's main numbers in one table, the advisor's view, and the charts."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _target(target: Any) -> str:
    if target is None:
        return "No target score set (time to target: –)."
    return f"Target score: {target}."


def _reached(time_to_target: dict[str, Any]) -> str:
    """The time to target, or – when no target was set (nothing to reach)."""
    return "–" if time_to_target["target"] is None else _minutes(time_to_target["time_s"])


def _minutes(seconds: Any) -> str:
    return "not reached" if seconds is None else f"{seconds / 60:.1f} min"


def table(summary: dict[str, Any]) -> list[str]:
    rows = [
        "| algorithm | ended by | final | best | time to target | applied | dropped |"
        " τ p50 / p95 / max | α mean | applied/h | rounds/h | never applied | loss σ / step σ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, a in summary["algorithms"].items():
        tau = a["tau"]
        taus = (
            "–" if tau["count"] == 0 else f"{tau['p50']:.0f} / {tau['p95']:.0f} / {tau['max']:.0f}"
        )
        rows.append(
            f"| {name} | {a['ended_by']} | {_num(a['final']['score'])} | {_num(a['best']['score'])}"
            f" | {_reached(a['time_to_target'])} | {a['updates']['applied']}"
            f" | {a['updates']['dropped']} | {taus} | {_num(a['alpha']['mean'])}"
            f" | {_num(a['rates']['applied_per_hour'], 0)}"
            f" | {_num(a['rates']['rounds_per_hour'], 1)}"
            f" | {a['acceptance']['clients_never_applied']}"
            f" | {_num(a['jitter']['loss_std'], 4)} / {_num(a['jitter']['loss_step_std'], 4)} |"
        )
    return rows


def attack_section(summary: dict[str, Any]) -> list[str]:
    """What the malicious devices (`[attack]`) got through, per algorithm; nothing without."""
    attack = summary["config"].get("attack")
    if attack is None:
        return []
    rows = [
        f"## Attack: `{attack['kind']}`, {attack['share']:.0%} of the devices",
        "",
        "| algorithm | final | malicious applied / sent | honest acceptance | refused by reason"
        " | backdoor success |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in summary["algorithms"].items():
        at = a["attack"]
        refused = ", ".join(f"{k} {v}" for k, v in at["malicious_rejected_by_reason"].items())
        rows.append(
            f"| {name} | {_num(a['final']['score'])}"
            f" | {at['malicious_applied']} / {at['malicious_submitted']}"
            f" | {_num(at['honest_acceptance'])} | {refused or '–'}"
            f" | {_num(at['backdoor_success'])} |"
        )
    return [*rows, ""]


#: alerts listed per algorithm in report.md (all of them are in summary.json)
MAX_ALERTS_SHOWN = 20


def rules_section(summary: dict[str, Any]) -> list[str]:
    """What the automatic rules did, per algorithm: switches flipped and alerts raised."""
    lines: list[str] = []
    for name, a in summary["algorithms"].items():
        changes, alerts = a.get("policy_changes", []), a.get("alerts", [])
        if not changes and not alerts:
            continue
        lines += [f"### {name}", ""]
        for c in changes:
            state = "on" if c["on"] else "off"
            rule = c.get("rule", "update-rate")
            lines.append(
                f"- {c['at_s']:.0f} s: `{c['switch']}` {state} (rule {rule},"
                f" policy version {c['policy_version']}): {c['why']}"
            )
        for alert in alerts[:MAX_ALERTS_SHOWN]:
            lines.append(
                f"- {alert['at_s']:.0f} s: alert from `{alert['rule']}`: {alert['message']}"
            )
        if len(alerts) > MAX_ALERTS_SHOWN:
            lines.append(f"- … {len(alerts) - MAX_ALERTS_SHOWN} more alerts in summary.json")
        lines.append("")
    return ["## Automatic rules", "", *lines] if lines else []


def device_privacy_section(summary: dict[str, Any]) -> list[str]:
    """The fleet's worst sample-level ε per algorithm, when the devices trained with DP-SGD."""
    rows = [
        f"| {name} | {p['worst_epsilon']:.3f} | {p['client']} | {p['delta']:g}"
        f" | {p['devices_reporting']} |"
        for name, a in summary["algorithms"].items()
        if (p := a.get("device_privacy")) is not None
    ]
    if not rows:
        return []
    return [
        "## DP-SGD on the devices",
        "",
        "The largest sample-level ε a device reported (its own accountant, over every run it"
        " trained), which device, at which δ, and how many devices reported.",
        "",
        "| algorithm | worst ε | device | δ | devices |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def write_report(summary: dict[str, Any], images: list[str], out: Path) -> None:
    config = summary["config"]
    advice = summary["advisor"]
    lines = [
        f"# Simulation `{summary['name']}` (seed {summary['seed']})",
        "",
        config["description"] or "",
        "",
        f"Task `{config['task']['name']}`, partition `{config['data']['partition']}`,"
        f" {summary['fleet']['devices']} devices, latency `{config['fleet']['latency']['kind']}`."
        f" {_target(config['eval']['target'])} Times are simulated.",
        "",
        *table(summary),
        "",
        "Jitter: σ of the test loss over the last evaluations, and σ of its successive"
        " differences (the oscillation without the trend).",
        "",
        "## τ_max advisor",
        "",
        f"Fleet update rate {advice['rate_per_s']:.3f}/s (every device training back to back),"
        f" P{advice['quantile'] * 100:.0f} latency {advice['slow_latency_s']:.0f} s:"
        f" expected τ of the slowest devices ≈ {advice['expected_tau_slowest']:.0f};"
        f" recommended τ_max {advice['recommended_tau_max']}"
        f" (range {advice['recommended_range'][0]}–{advice['recommended_range'][1]}),"
        f" which permanently drops {advice['permanently_dropped_share']:.0%} of the devices.",
        "",
        *rules_section(summary),
        *attack_section(summary),
        *device_privacy_section(summary),
        "## Charts",
        "",
        *[f"![{name}]({name})" for name in images],
        "",
        "Files: `summary.json` (every number), `curves.csv`, `decisions.csv`, `clients.csv`,"
        " `rounds.csv`.",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
