"""The event loop: budgets, dropouts, availability, traces, and the clock's ordering."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedasync.sim.clock import EventQueue
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary
from tests.sim.helpers import config, fixed_fleet


def test_events_at_the_same_time_keep_their_scheduling_order() -> None:
    queue: EventQueue[str] = EventQueue()
    for name, time in [("b", 2.0), ("a1", 1.0), ("a2", 1.0), ("a3", 1.0)]:
        queue.push(time, name)
    assert [queue.pop()[1] for _ in range(4)] == ["a1", "a2", "a3", "b"]
    assert queue.now == 2.0
    with pytest.raises(ValueError, match="before now"):
        queue.push(1.0, "late")


@pytest.mark.parametrize(
    ("budget", "ended_by"),
    [
        ({"max_updates": 25, "max_seconds": 10_000}, "max_updates"),
        ({"max_seconds": 200}, "max_seconds"),
    ],
)
@pytest.mark.parametrize("kind", ["fedasync", "fedavg"])
def test_the_budget_that_ends_the_run_is_reported(
    budget: dict[str, float], ended_by: str, kind: str
) -> None:
    algorithm = {"kind": kind, "tau_max": 100} if kind == "fedasync" else {"kind": kind}
    cfg = config(budget=budget, algorithms=[algorithm])
    sim = simulate(cfg)
    result = sim.results[0]
    assert result.ended_by == ended_by
    summary = build_summary(sim)["algorithms"][kind]
    assert summary["ended_by"] == ended_by
    if ended_by == "max_updates":
        assert result.recorder.updates_applied >= 25
    else:
        assert result.end_s == 200.0
        assert result.recorder.updates_applied < 60
    assert result.recorder.evals[-1].time_s == result.end_s


def test_dropouts_lose_runs_and_submit_nothing() -> None:
    cfg = config(
        fleet=fixed_fleet([10.0] * 4, dropout=0.5),
        algorithms=[{"kind": "fedasync", "tau_max": 1000}],
        budget={"max_updates": 10_000, "max_seconds": 1000},
    )
    rec = simulate(cfg).results[0].recorder
    lost, submitted = sum(rec.lost), sum(rec.submitted)
    assert lost > 0
    assert submitted > 0
    assert lost + submitted >= 400  # a lost run frees the device earlier than a finished one
    assert 0.35 < lost / (lost + submitted) < 0.65


def test_intermittent_devices_only_train_while_online() -> None:
    cfg = config(
        fleet={
            **fixed_fleet([10.0] * 6),
            "availability": {"kind": "intermittent", "online_mean_s": 100, "offline_mean_s": 100},
        },
        algorithms=[{"kind": "fedasync", "tau_max": 1000}],
        budget={"max_updates": 10_000, "max_seconds": 3000},
    )
    rec = simulate(cfg).results[0].recorder
    always = 6 * 300
    assert 0.3 * always < sum(rec.submitted) < 0.7 * always
    assert sum(rec.lost) > 0  # some runs were cut by their device going offline


def test_a_trace_is_replayed_exactly(tmp_path: Path) -> None:
    (tmp_path / "durations.csv").write_text("device,duration_s\nphone,4\nboard,30\nphone,6\n")
    (tmp_path / "windows.csv").write_text(
        "device,online_from_s,online_until_s\nphone,0,100\nboard,0,1000\nphone,200,300\n"
    )
    (tmp_path / "fedasync.sim.toml").write_text(
        '[task]\nname = "linear"\nparams = {samples = 400}\n'
        "[fleet]\ndevices = 2\n"
        'latency = {kind = "trace", path = "durations.csv"}\n'
        'availability = {kind = "trace", path = "windows.csv"}\n'
        "[budget]\nmax_seconds = 1000\nmax_updates = 10000\n"
        '[[algorithms]]\nkind = "fedasync"\ntau_max = 1000\n'
    )
    from fedasync.sim.config import load_config

    sim = simulate(load_config(tmp_path / "fedasync.sim.toml"))
    rec = sim.results[0].recorder
    assert sim.world.client_ids == ["phone", "board"]
    phone_times = [d.time_s for d in rec.decisions if d.device == 0]
    # 4, 6, 4, 6, ...: 10 s per pair while online in [0, 100) and [200, 300)
    assert phone_times[:4] == [4.0, 10.0, 14.0, 20.0]
    assert all(t <= 100 or 200 <= t <= 300 for t in phone_times)
    assert len(phone_times) == 2 * 20
    assert [d.time_s for d in rec.decisions if d.device == 1] == [30.0 * k for k in range(1, 34)]


def test_a_fleet_that_never_comes_back_ends_the_run(tmp_path: Path) -> None:
    (tmp_path / "windows.csv").write_text("device,online_from_s,online_until_s\nd0,0,35\nd1,0,35\n")
    for algorithm in ({"kind": "fedasync", "tau_max": 100}, {"kind": "fedavg"}):
        cfg = config(
            fleet={
                **fixed_fleet([10.0, 10.0]),
                "availability": {"kind": "trace", "path": "windows.csv"},
            },
            algorithms=[algorithm],
            base_dir=str(tmp_path),
        )
        result = simulate(cfg).results[0]
        assert result.ended_by == "no_more_events"
        assert sum(result.recorder.submitted) == 6  # three 10 s runs each in [0, 35)
