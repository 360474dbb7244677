"""What `fedasync up` shows while it runs: one status read from the control service, drawn.

The figures are the control service's `/v1/status` (the same window and rules the dashboard
uses), so the terminal and the dashboard never disagree.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text


def num(value: Any, digits: int = 2) -> str:
    """A figure to show, or a dash when there is none yet."""
    return "–" if value is None else f"{value:.{digits}f}"


def _tau(recent: dict[str, Any]) -> str:
    tau = recent.get("tau")
    return "–" if not tau else f"{tau['p50']:.0f} / {tau['p95']:.0f}"


def _accuracy(status: dict[str, Any]) -> str:
    evaluation = status.get("evaluation")
    if not evaluation:
        return "–"
    return f"{num(evaluation['score'], 3)} (v{evaluation['version']})"


def _budget(status: dict[str, Any]) -> str:
    done = status.get("training_done")
    if done:
        return f"done: {done.get('reason', '?')}"
    updates, seconds = status.get("budget_left_updates"), status.get("budget_left_seconds")
    return f"{updates if updates is not None else '–'} updates / {num(seconds, 0)} s"


def describe_privacy(privacy: dict[str, Any]) -> str:
    """ε spent under each model the run reports, at its δ, against the budget (if any): the
    live view's and the summary's line, from `/v1/status`'s `privacy` (or the summary's)."""
    spent = [
        f"{num(privacy.get(f'epsilon_{model}'))} {model}"
        for model in ("conservative", "sampled")
        if privacy.get(f"epsilon_{model}") is not None
    ]
    text = " · ".join(spent) or "–"
    text += f" at δ {privacy.get('delta'):g}" if privacy.get("delta") is not None else ""
    budget = privacy.get("budget")
    if budget is not None:
        text += f"; budget {budget:g} ({privacy.get('model')})"
    return text


def starting(status: dict[str, Any]) -> bool:
    """Nothing decided yet: the devices are still loading, fetching and training their first
    update (about half a minute with the defaults), so there is no rate or τ to show."""
    return not status.get("decisions") and not status.get("training_done")


def waiting_for(status: dict[str, Any], devices_running: int, devices: int) -> str:
    """What start-up is waiting for, in one line, instead of figures that are all zero."""
    evaluation = status.get("evaluation")
    initial = "" if not evaluation else f"; initial model scores {num(evaluation['score'], 3)}"
    return (
        f"starting: waiting for the devices' first updates ({devices_running} of {devices} "
        f"device processes running: each loads its data, fetches version "
        f"{status.get('version') or 0} and trains once){initial}"
    )


def figures(status: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) pairs shared by the live view and the plain progress line."""
    recent = status.get("recent", {})
    totals = recent.get("totals", {})
    return [
        ("version", str(status.get("version", "–"))),
        # the summary's figure (shared/stats.py AppliedRate): from the first applied update on
        ("applied/s", num(recent.get("applied_per_second"), 1)),
        (f"decided/s (last {recent.get('window_s', 30):g} s)", num(recent.get("update_rate"), 1)),
        ("applied", str(totals.get("applied", 0))),
        ("dropped", str(totals.get("dropped", 0))),
        # every refusal is a dead letter (the core's rejections are also in the ledger)
        ("rejected", str(status.get("dead_letters", 0))),
        ("τ p50/p95", _tau(recent)),
        ("accuracy", _accuracy(status)),
        ("budget left", _budget(status)),
        # differential privacy only: a run without it shows what it always showed
        *([("ε", describe_privacy(status["privacy"]))] if status.get("privacy") else []),
    ]


def switched_on(status: dict[str, Any], policy: dict[str, Any] | None = None) -> list[str]:
    """What an operator (or a rule) turned on: a pause of aggregation or of ingest (policy
    fields) and the switches, so that neither view hides why nothing is being applied."""
    shown = []
    if (policy or {}).get("paused"):
        shown.append("aggregation paused")
    if (policy or {}).get("ingest_paused"):
        shown.append("ingest paused")
    return shown + list(status.get("switches_on") or [])


def line(
    status: dict[str, Any],
    elapsed: float,
    devices_running: int = 0,
    devices: int = 0,
    policy: dict[str, Any] | None = None,
) -> str:
    """The plain progress line (`--no-live`): the live view's figures and what is switched on."""
    on = switched_on(status, policy)
    suffix = f"  on: {', '.join(on)}" if on else ""
    if starting(status):
        return f"[{elapsed:5.0f} s] " + waiting_for(status, devices_running, devices) + suffix
    parts = [f"{name} {value}" for name, value in figures(status)]
    return f"[{elapsed:5.0f} s] " + "  ".join(parts) + suffix


def alert_line(alert: dict[str, Any]) -> str:
    """An alert as both views show it."""
    return f"alert [{alert.get('rule')}] {alert.get('message')}"


def render(
    status: dict[str, Any] | None,
    alerts: list[dict[str, Any]],
    elapsed: float,
    problems: list[str],
    devices_running: int = 0,
    devices: int = 0,
    policy: dict[str, Any] | None = None,
) -> Group:
    table = Table(show_header=False, box=None, padding=(0, 2))
    if status is None:
        table.add_row("waiting for the control service…", "")
    elif starting(status):
        table.add_row(Text(waiting_for(status, devices_running, devices), style="yellow"))
        table.add_row(f"budget left {_budget(status)}")
    else:
        for name, value in figures(status):
            table.add_row(name, Text(value, style="bold"))
        on = switched_on(status, policy)
        table.add_row("switched on", Text(", ".join(on) or "none", style="yellow"))
        if status.get("stream_length") is not None:
            table.add_row(
                "lag", f"{status.get('lag', 0)} entries, {status.get('pending', 0)} pending"
            )
    parts: list[Any] = [Text(f"fedasync up · {elapsed:.0f} s", style="bold cyan"), table]
    for alert in alerts[:3]:
        parts.append(Text(alert_line(alert), style="red"))
    for problem in problems:
        parts.append(Text(problem, style="bold red"))
    return Group(*parts)
