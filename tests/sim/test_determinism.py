"""Same config and seed ⇒ byte-identical summary.json and curves; another seed ⇒ different."""

from __future__ import annotations

from pathlib import Path

from fedasync.sim.output import write_all, write_data
from fedasync.sim.runner import simulate
from tests.sim.helpers import LINEAR, config

DIGITS = {
    **LINEAR,
    "task": {"name": "digits", "params": {"hidden": 8}},
    "data": {"partition": "dirichlet", "beta": 0.5},
    "fleet": {"devices": 8, "latency": {"kind": "longtail"}, "dropout": 0.1},
    "budget": {"max_updates": 40, "max_seconds": 3600},
    "algorithms": [
        {"kind": "fedasync", "tau_max": 4},
        {"kind": "fedbuff", "buffer_size": 3, "tau_max": 20},
        {"kind": "fedavg", "clients_per_round": 3, "over_selection": 0.5},
    ],
}
FILES = ("summary.json", "curves.csv", "decisions.csv", "clients.csv", "rounds.csv")


def run(tmp: Path, folder: str, seed: int) -> dict[str, bytes]:
    out = tmp / folder
    write_data(simulate(config(DIGITS, seed=seed)), out)
    return {name: (out / name).read_bytes() for name in FILES}


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    first = run(tmp_path, "a", seed=7)
    second = run(tmp_path, "b", seed=7)
    other = run(tmp_path, "c", seed=8)
    assert first == second
    assert first["summary.json"] != other["summary.json"]
    assert first["curves.csv"] != other["curves.csv"]


def test_full_output_has_the_report_and_every_chart(tmp_path: Path) -> None:
    summary = write_all(simulate(config(DIGITS, seed=1)), tmp_path)
    report = (tmp_path / "report.md").read_text()
    for chart in ("accuracy", "accuracy_updates", "loss", "tau", "alpha", "acceptance"):
        assert (tmp_path / f"{chart}.png").stat().st_size > 10_000
        assert f"]({chart}.png)" in report
    assert (tmp_path / "per_class.png").is_file()
    assert set(summary["algorithms"]) == {"fedasync", "fedbuff", "fedavg"}
    for name in summary["algorithms"]:
        assert name in report
