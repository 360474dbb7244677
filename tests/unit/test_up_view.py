"""`fedasync up`'s live view: what start-up waits for, and the rate it shows."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fedasync.services.commands.up import view


def status(decisions: int, **extra: Any) -> dict[str, Any]:
    return {
        "version": 0,
        "decisions": decisions,
        "dead_letters": 0,
        "recent": {"window_s": 30.0, "totals": {}, "update_rate": 0.0},
        "evaluation": {"version": 0, "score": 0.0696},
        "budget_left_updates": 400,
        "budget_left_seconds": 110.0,
        "training_done": None,
    } | extra


def shown(renderable: Any) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_start_up_says_what_it_is_waiting_for_not_zero_figures() -> None:
    line = view.line(status(0), 12.0, devices_running=10, devices=10)
    assert line == (
        "[   12 s] starting: waiting for the devices' first updates (10 of 10 device processes "
        "running: each loads its data, fetches version 0 and trains once); initial model "
        "scores 0.070"
    )
    assert "updates/s" not in line
    drawn = shown(view.render(status(0), [], 12.0, [], devices_running=9, devices=10))
    assert "waiting for the devices' first updates (9 of 10 device processes running" in drawn
    assert "applied/s" not in drawn


def test_once_decisions_come_the_figures_show_the_summary_s_rate() -> None:
    running = status(
        25,
        version=20,
        recent={
            "window_s": 30.0,
            "totals": {"applied": 20, "dropped": 5},
            "update_rate": 0.8,
            "applied_per_second": 12.34,
        },
    )
    line = view.line(running, 40.0, devices_running=10, devices=10)
    assert "starting" not in line
    assert "applied/s 12.3" in line  # shared/stats.py AppliedRate, as in the summary
    assert "decided/s (last 30 s) 0.8" in line


def test_the_plain_line_shows_a_pause_and_the_switches_as_the_live_view_does() -> None:
    running = status(25, version=20, switches_on=["raise-gamma"])
    policy = {"paused": True, "ingest_paused": False}
    line = view.line(running, 40.0, 10, 10, policy)
    assert line.endswith("  on: aggregation paused, raise-gamma")
    assert view.line(status(25, version=20), 40.0, 10, 10, {"paused": False}).count(" on: ") == 0
    drawn = shown(view.render(running, [], 40.0, [], 10, 10, policy))
    [row] = [text for text in drawn.splitlines() if "switched on" in text]
    assert row.split() == ["switched", "on", "aggregation", "paused,", "raise-gamma"]
    alert = {"id": "1-0", "rule": "fairness", "message": "device-3 under 10%"}
    assert view.alert_line(alert) == "alert [fairness] device-3 under 10%"


PRIVACY = {
    "epsilon_sampled": 0.4213,
    "epsilon_conservative": 3.1,
    "delta": 1e-5,
    "budget": 8.0,
    "model": "conservative",
    "clip": 1.0,
}


def test_with_dp_on_both_views_show_epsilon_against_the_budget() -> None:
    running = status(12, privacy=PRIVACY)
    expected = "ε 3.10 conservative · 0.42 sampled at δ 1e-05; budget 8 (conservative)"
    assert expected in view.line(running, 30.0)
    assert "3.10 conservative · 0.42 sampled at δ 1e-05; budget 8" in shown(
        view.render(running, [], 30.0, [])
    )


def test_without_dp_neither_view_shows_epsilon() -> None:
    running = status(12, privacy=None)
    assert "ε" not in view.line(running, 30.0)
    assert "ε" not in shown(view.render(running, [], 30.0, []))
    # sampled is not reported without the population: only what is reported is shown
    only = view.describe_privacy(PRIVACY | {"epsilon_sampled": None, "budget": None})
    assert only == "3.10 conservative at δ 1e-05"
