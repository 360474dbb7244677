"""The run folder's charts, drawn as the simulator draws its own (shared/charts.py).

Each chart has axis labels with units, a title and a legend where there is more than one line.
The `*_figure` functions build a chart without writing it, so its content can be checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.shared.charts import new_figure, png_bytes


def save_png(figure: Figure, path: Path) -> str:
    path.write_bytes(png_bytes(figure))
    return path.name


def accuracy_figure(curve: Sequence[EvaluationRecord], started_at: float) -> Figure | None:
    """Test score of each evaluated version, as steps from the first evaluation.

    A version holds until the next one is committed, so the score is drawn as a step (held flat
    until the next commit), never as a slope joining two versions: the start-up, when devices
    are still loading and training their first update, would otherwise look like learning. It
    is shaded and named instead.
    """
    if not curve:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    seconds = [r.committed_at - started_at for r in curve]
    if curve[0].version == 0 and len(curve) > 1:
        ax.axvspan(
            seconds[0],
            seconds[1],
            color="grey",
            alpha=0.15,
            label="start-up: devices starting, no update yet",
        )
    scores = [math.nan if r.score is None else r.score for r in curve]  # None: a gap
    ax.plot(seconds, scores, color="black", linewidth=2, label="overall", drawstyle="steps-post")
    for name in curve[-1].per_class:
        points = [
            (s, r.per_class[name])
            for s, r in zip(seconds, curve, strict=True)
            if name in r.per_class
        ]
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            linewidth=0.8,
            label=f"class {name}",
            drawstyle="steps-post",
        )
    ax.set_xlim(left=seconds[0])
    ax.set_xlabel("time since training started (s, when the version was committed)")
    name = "accuracy" if curve[-1].accuracy is not None else "R²"
    ax.set_ylabel(f"test {name} (fraction)")
    ax.set_title(f"Test {name} of each evaluated version (held until the next one)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return figure


def accuracy(curve: Sequence[EvaluationRecord], started_at: float, out: Path) -> str | None:
    figure = accuracy_figure(curve, started_at)
    return None if figure is None else save_png(figure, out / "accuracy.png")


def histogram(values: Sequence[float], field: str, tau_max: int, out: Path) -> str | None:
    if not values:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    if field == "tau":
        top = int(max(values))
        ax.hist(values, bins=[b - 0.5 for b in range(top + 2)], label="updates received")
        ax.axvline(tau_max + 0.5, color="grey", linestyle=":", label=f"τ_max = {tau_max}")
        ax.set_xlabel("staleness τ of each update received (model versions)")
        ax.set_title("Staleness of the updates the aggregator decided")
        ax.legend()
    else:
        ax.hist(values, bins=40)
        ax.set_xlabel("effective mixing weight α of each applied update (dimensionless)")
        ax.set_title("Effective α of applied updates")
    ax.set_ylabel("updates (count)")
    ax.grid(alpha=0.3)
    return save_png(figure, out / f"{field}.png")


def acceptance_figure(clients: Sequence[dict[str, Any]]) -> Figure | None:
    """Per-client acceptance, worst first, each bar labelled with its counts.

    A client at 0% would have no bar at all and look like missing data: it gets a red marker
    on the axis and its label, like every other client.
    """
    if not clients:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    names = [c["client"] for c in clients]
    rates = [c["rate"] for c in clients]
    ax.barh(names, rates, color="tab:blue")
    never = [c["client"] for c in clients if c["applied"] == 0]
    if never:
        ax.scatter(
            [0.0] * len(never),
            never,
            marker="o",
            color="tab:red",
            zorder=3,
            clip_on=False,
            label="no update applied",
        )
        ax.legend(loc="upper right", fontsize=8)
    for c in clients:
        inside = c["rate"] > 0.8  # a long bar: the label goes inside it, in white
        ax.text(
            c["rate"] - 0.01 if inside else c["rate"] + 0.015,
            c["client"],
            f"{c['rate']:.0%} ({c['applied']} of {c['decided']})",
            va="center",
            ha="right" if inside else "left",
            fontsize=7,
            color="white" if inside else ("tab:red" if c["applied"] == 0 else "black"),
        )
    ax.invert_yaxis()  # worst first, at the top
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the client's updates applied (fraction)")
    ax.set_title("Per-client acceptance, worst first")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return figure


def acceptance(clients: Sequence[dict[str, Any]], out: Path) -> str | None:
    figure = acceptance_figure(clients)
    return None if figure is None else save_png(figure, out / "acceptance.png")
