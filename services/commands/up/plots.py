"""The run folder's charts (matplotlib's object API on Agg, as the simulator draws its own).

Each chart has axis labels with units, a title and a legend where there is more than one line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.sim.plots import new_figure, save_png


def accuracy(curve: Sequence[EvaluationRecord], started_at: float, out: Path) -> str | None:
    if not curve:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    seconds = [r.committed_at - started_at for r in curve]
    scores = [math.nan if r.score is None else r.score for r in curve]  # None: a gap
    ax.plot(seconds, scores, color="black", linewidth=2, label="overall")
    for name in curve[-1].per_class:
        points = [
            (s, r.per_class[name])
            for s, r in zip(seconds, curve, strict=True)
            if name in r.per_class
        ]
        ax.plot(
            [p[0] for p in points], [p[1] for p in points], linewidth=0.8, label=f"class {name}"
        )
    ax.set_xlabel("time since training started (s, when the version was committed)")
    name = "accuracy" if curve[-1].accuracy is not None else "R²"
    ax.set_ylabel(f"test {name} (fraction)")
    ax.set_title(f"Test {name} of each evaluated version")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_png(figure, out / "accuracy.png")


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


def acceptance(clients: Sequence[dict[str, Any]], out: Path) -> str | None:
    if not clients:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    names = [c["client"] for c in clients]
    ax.barh(names, [c["rate"] for c in clients], color="tab:blue")
    ax.invert_yaxis()  # worst first, at the top
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the client's updates applied (fraction)")
    ax.set_title("Per-client acceptance, worst first")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return save_png(figure, out / "acceptance.png")
