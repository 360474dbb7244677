"""The report's charts, drawn with matplotlib's object API on the Agg canvas (no GUI, no pyplot).

Each chart has axis labels with units, a title and a legend, so a PNG stands on its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from fedasync.shared.charts import new_figure, png_bytes
from fedasync.sim.result import RunResult
from fedasync.sim.runner import Simulation


def save_png(figure: Figure, path: Path) -> str:
    """Write the chart (the same bytes for the same chart, shared/charts.py); its file name."""
    path.write_bytes(png_bytes(figure))
    return path.name


def _score_name(sim: Simulation) -> str:
    return "accuracy" if sim.world.task.num_classes else "R²"


def _async(sim: Simulation) -> list[RunResult]:
    return [r for r in sim.results if r.kind != "fedavg"]


def curve(sim: Simulation, out: Path, *, by: str) -> str:
    figure = new_figure()
    ax = figure.add_subplot()
    name = _score_name(sim)
    for r in sim.results:
        points = r.recorder.evals
        x = [p.time_s / 60 if by == "time" else float(p.updates) for p in points]
        ax.plot(x, [p.score for p in points], label=r.name, drawstyle="steps-post")
    target = sim.world.config.eval.target
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    if by == "time":
        ax.set_xlabel("simulated time (min)")
        ax.set_title(f"Test {name} against simulated time")
    else:
        ax.set_xlabel("updates applied to the model (device results)")
        ax.set_title(f"Test {name} against updates applied")
    ax.set_ylabel(f"test {name} (fraction)" if name == "accuracy" else "test R²")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(figure, out / f"{'accuracy' if by == 'time' else 'accuracy_updates'}.png")


def loss_curve(sim: Simulation, out: Path) -> str:
    figure = new_figure()
    ax = figure.add_subplot()
    for r in sim.results:
        points = r.recorder.evals
        ax.plot([p.time_s / 60 for p in points], [p.loss for p in points], label=r.name)
    ax.set_xlabel("simulated time (min)")
    ax.set_ylabel("test loss (cross-entropy or MSE)")
    ax.set_yscale("log")
    ax.set_title("Test loss against simulated time")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(figure, out / "loss.png")


def histogram(sim: Simulation, out: Path, *, field: str) -> str:
    figure = new_figure()
    ax = figure.add_subplot()
    runs = _async(sim)
    series = []
    for r in runs:
        chosen = (d.tau if field == "tau" else d.alpha for d in r.recorder.decisions)
        series.append([float(v) for v in chosen if v is not None])
    everything = [v for values in series for v in values]
    edges = np.histogram_bin_edges(everything or [0.0, 1.0], bins=60).tolist()
    for r, values, style in zip(runs, series, ["-", "--", ":", "-."] * 3, strict=False):
        if values:
            ax.hist(
                values, bins=edges, histtype="step", linewidth=1.5, linestyle=style, label=r.name
            )
        if field == "tau":
            ax.axvline(r.settings["tau_max"], linestyle=":", linewidth=1, color="grey")
    if field == "tau":
        ax.set_xlabel("staleness τ of each update received (model versions); dotted: τ_max")
        ax.set_title("Staleness of the updates the server received")
    else:
        ax.set_xlabel("effective mixing weight α of each applied update (dimensionless)")
        ax.set_title("Effective α of applied updates")
    ax.set_ylabel("updates (count, log scale)")
    ax.set_yscale("log")  # a long tail of very stale updates next to a tall fresh peak
    ax.grid(alpha=0.3)
    if everything:  # a run that only refused updates has no τ or α to show
        ax.legend()
    return save_png(figure, out / f"{field}.png")


def acceptance(sim: Simulation, out: Path) -> str:
    figure = new_figure()
    ax = figure.add_subplot()
    medians = np.asarray(sim.world.medians_s)
    for r, marker in zip(sim.results, "os^vDP*X", strict=False):
        sub = np.asarray(r.recorder.submitted, dtype=np.float64)
        used = np.asarray(r.recorder.applied, dtype=np.float64)
        rate = np.divide(used, sub, out=np.zeros_like(used), where=sub > 0)
        ax.scatter(medians, rate, marker=marker, s=18, alpha=0.6, label=r.name)
    ax.set_xscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel("device median latency of a training run (s, log scale)")
    ax.set_ylabel("share of the device's results applied")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Per-client acceptance against device speed")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(figure, out / "acceptance.png")


def per_class(sim: Simulation, out: Path) -> str | None:
    classes = sim.world.task.num_classes
    if not classes:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    width = 0.8 / len(sim.results)
    for i, r in enumerate(sim.results):
        final = r.recorder.evals[-1].per_class
        x = np.arange(classes) + i * width - 0.4 + width / 2
        ax.bar(x, [final.get(k, 0.0) for k in range(classes)], width, label=r.name)
    ax.set_xticks(range(classes))
    ax.set_xlabel("class")
    ax.set_ylabel("final test accuracy of the class (fraction)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Final accuracy per class")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(4, len(sim.results)))
    return save_png(figure, out / "per_class.png")


_SWITCH_COLOURS = {
    "raise-gamma": "tab:orange",
    "lower-alpha": "tab:purple",
    "freshest-only": "tab:red",
}


def rules_chart(sim: Simulation, out: Path) -> str | None:
    """What the automatic rules saw and did: per algorithm with rules, the update rate over the
    rules' window at each evaluation (and the lag, when it is ever non-zero), with each switch's
    on-periods shaded. None when no algorithm ran rules."""
    runs = [r for r in _async(sim) if r.rule_figures]
    if not runs:
        return None
    figure = new_figure(height=2.2 + 2.3 * len(runs))
    axes = figure.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, r in zip(axes, runs, strict=True):
        times = [t / 60 for t, _, _ in r.rule_figures]
        ax.plot(
            times, [rate for _, rate, _ in r.rule_figures], color="tab:blue", label="update rate"
        )
        ax.set_ylabel("decisions per second\n(over the rules' window)")
        handles, labels = ax.get_legend_handles_labels()
        for switch in sorted({c["switch"] for c in r.policy_changes}):
            colour = _SWITCH_COLOURS.get(switch, "grey")
            on_at: float | None = None
            for change in (c for c in r.policy_changes if c["switch"] == switch):
                if change["on"]:
                    on_at = change["at_s"] / 60
                elif on_at is not None:
                    ax.axvspan(on_at, change["at_s"] / 60, color=colour, alpha=0.2)
                    on_at = None
            if on_at is not None:
                ax.axvspan(on_at, r.end_s / 60, color=colour, alpha=0.2)
            handles.append(Patch(color=colour, alpha=0.2))
            labels.append(f"{switch} on")
        lags = [lag for _, _, lag in r.rule_figures]
        if any(lags):
            twin = ax.twinx()
            (line,) = twin.plot(times, lags, color="tab:green", linestyle="--")
            twin.set_ylabel("lag (updates waiting)")
            handles.append(line)
            labels.append("lag")
        ax.set_title(r.name)
        ax.grid(alpha=0.3)
        ax.legend(handles, labels, loc="upper right", fontsize="small")
    axes[-1].set_xlabel("simulated time (min)")
    figure.suptitle("What the automatic rules saw, and the switches they turned on")
    return save_png(figure, out / "rules.png")


def privacy_chart(sim: Simulation, out: Path) -> str | None:
    """ε spent against updates applied, both accounting models, per DP run (at each
    evaluation, RDP as the core counts it live); None when no run used DP."""
    runs = [r for r in _async(sim) if r.recorder.epsilon]
    if not runs:
        return None
    figure = new_figure()
    ax = figure.add_subplot()
    for r in runs:
        points = r.recorder.epsilon
        updates = [float(n) for _, n, _, _ in points]
        conservative = [c if c is not None else float("nan") for _, _, _, c in points]
        (line,) = ax.plot(updates, conservative, label=f"{r.name} (conservative)")
        sampled = [s for _, _, s, _ in points if s is not None]
        if len(sampled) == len(points):
            ax.plot(
                updates,
                sampled,
                color=line.get_color(),
                linestyle="--",
                label=f"{r.name} (sampled)",
            )
        if r.privacy is not None and r.privacy["budget"] is not None:
            ax.axhline(r.privacy["budget"], color=line.get_color(), linestyle=":", linewidth=1)
    delta = runs[0].privacy["delta"] if runs[0].privacy is not None else None
    ax.set_xlabel("updates applied to the model (device results)")
    ax.set_ylabel(f"ε spent (δ = {delta:g})" if delta is not None else "ε spent")
    ax.set_title("Privacy spent against updates applied (dotted: the privacy budget)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_png(figure, out / "privacy.png")


def write_plots(sim: Simulation, out: Path) -> list[str]:
    """Every chart as a PNG in `out`; returns the file names in report order."""
    images = [
        curve(sim, out, by="time"),
        curve(sim, out, by="updates"),
        loss_curve(sim, out),
        histogram(sim, out, field="tau"),
        histogram(sim, out, field="alpha"),
        acceptance(sim, out),
    ]
    classes = per_class(sim, out)
    if classes is not None:
        images.append(classes)
    rules = rules_chart(sim, out)
    if rules is not None:
        images.append(rules)
    privacy = privacy_chart(sim, out)
    if privacy is not None:
        images.append(privacy)
    return images
