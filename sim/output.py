"""Write a simulation's files: summary.json, curves and per-update CSVs, plots, report.md.

CSV floats are written with `repr`, so the curves are as byte-identical as the summary.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedasync.sim.runner import Simulation
from fedasync.sim.summary import build_summary, dumps


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow([cell(v) for v in row])


def write_data(sim: Simulation, out: Path) -> dict[str, Any]:
    """summary.json and the CSVs; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(sim)
    (out / "summary.json").write_text(dumps(summary))
    world = sim.world
    classes = list(range(world.task.num_classes))
    write_csv(
        out / "curves.csv",
        ["algorithm", "time_s", "updates", "version", "loss", "score"]
        + [f"class_{k}" for k in classes],
        (
            [r.name, p.time_s, p.updates, p.version, p.loss, p.score]
            + [p.per_class.get(k) for k in classes]
            for r in sim.results
            for p in r.recorder.evals
        ),
    )
    write_csv(
        out / "decisions.csv",
        ["algorithm", "time_s", "client", "outcome", "reason", "tau", "alpha", "step_norm"],
        (
            (r.name, d.time_s, world.client_ids[d.device], d.outcome, d.reason, *d.scalars())
            for r in sim.results
            for d in r.recorder.decisions
        ),
    )
    write_csv(
        out / "clients.csv",
        ["algorithm", "client", "median_latency_s", "samples", "submitted", "applied", "lost"],
        (
            [
                r.name,
                world.client_ids[i],
                world.medians_s[i],
                world.device_data.size(i),
                r.recorder.submitted[i],
                r.recorder.applied[i],
                r.recorder.lost[i],
            ]
            for r in sim.results
            for i in range(world.num_devices)
        ),
    )
    write_csv(
        out / "rounds.csv",
        ["algorithm", "round", "start_s", "end_s", "selected", "kept"],
        (
            [r.name, n, rd.start_s, rd.end_s, len(rd.selected), len(rd.kept)]
            for r in sim.results
            for n, rd in enumerate(r.recorder.rounds)
        ),
    )
    return summary


def write_all(sim: Simulation, out: Path) -> dict[str, Any]:
    """Everything, plots and report included."""
    from fedasync.sim.plots import write_plots  # matplotlib only when plots are wanted
    from fedasync.sim.report import write_report

    summary = write_data(sim, out)
    images = write_plots(sim, out)
    write_report(summary, images, out)
    return summary
