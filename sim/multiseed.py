"""One configuration over several seeds: every claim in docs/experiments.md rests on more than one
run (`fedasync simulate --preset NAME --seeds 5 [--jobs 2]`).

Each seed is a whole, ordinary simulation (its own folder `seed<k>/`, byte for byte what
`fedasync simulate --seed k` writes); the seeds run in up to `jobs` worker processes, which
changes nothing in any result (each is deterministic and independent). Then, across seeds, per
algorithm: mean ± sample sd of the final score, of every class's final accuracy and of the time
to the target (over the seeds that reached it, with how many did), and the per-seed values;
written to `seeds.json` (every number) and `seeds.md` (the tables), and a chart of each
algorithm's per-class accuracy over time, averaged over the seeds (`per_class_time.png`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedasync.sim.config import SimConfig
from fedasync.sim.summary import dumps

#: thresholds every table times besides the config's target (the rare-class goal uses 0.85)
THRESHOLDS = (0.80, 0.85, 0.90)


@dataclass(frozen=True, slots=True)
class SeedRun:
    """What one seed's run hands back: its summary and each algorithm's evaluations."""

    seed: int
    summary: dict[str, Any]
    #: algorithm → [(time_s, score, {class: accuracy})]
    curves: dict[str, list[tuple[float, float, dict[int, float]]]]


def run_seed(config: SimConfig, out: Path, plots: bool) -> SeedRun:
    """Simulate `config` (one seed) and write its folder; runs in a worker process."""
    from fedasync.sim.output import write_all, write_data
    from fedasync.sim.runner import simulate

    sim = simulate(config)
    summary = write_all(sim, out) if plots else write_data(sim, out)
    curves = {
        r.name: [(p.time_s, p.score, dict(p.per_class)) for p in r.recorder.evals]
        for r in sim.results
    }
    return SeedRun(config.seed, summary, curves)


def run_seeds(
    configs: Sequence[SimConfig],
    out: Path,
    *,
    jobs: int = 1,
    plots: bool = False,
    done: Callable[[SeedRun], None] | None = None,
) -> list[SeedRun]:
    """Every config (one per seed) into `out/seed<k>`, at most `jobs` at a time, in seed order."""
    folders = [out / f"seed{c.seed}" for c in configs]
    if jobs <= 1:
        runs = []
        for config, folder in zip(configs, folders, strict=True):
            runs.append(run_seed(config, folder, plots))
            if done is not None:
                done(runs[-1])
        return runs
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(run_seed, c, f, plots) for c, f in zip(configs, folders, strict=True)
        ]
        results = []
        for future in futures:
            results.append(future.result())
            if done is not None:
                done(results[-1])
        return results


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """mean, sample sd, n of the values that exist, and the values (None: not reached)."""
    present = [float(v) for v in values if v is not None]
    mean = float(np.mean(present)) if present else None
    sd = float(np.std(present, ddof=1)) if len(present) > 1 else None
    return {"mean": mean, "sd": sd, "n": len(present), "values": list(values)}


def time_to(curve: Sequence[tuple[float, float, dict[int, float]]], target: float) -> float | None:
    """The first evaluation time at or above `target` (the evaluation interval's resolution)."""
    return next((t for t, score, _ in curve if score >= target), None)


def aggregate(runs: Sequence[SeedRun], config: SimConfig) -> dict[str, Any]:
    """Across seeds, per algorithm: the figures the tables show (see the module docstring)."""
    names = list(runs[0].summary["algorithms"])
    classes = sorted({k for run in runs for c in run.curves.values() for k in c[-1][2]})
    rare = config.data.rare_class if config.data.partition == "rare_class_on_slow" else None
    thresholds = sorted({*THRESHOLDS, *([config.eval.target] if config.eval.target else [])})
    algorithms: dict[str, Any] = {}
    for name in names:
        summaries = [run.summary["algorithms"][name] for run in runs]
        curves = [run.curves[name] for run in runs]
        finals = [c[-1][2] for c in curves]
        entry: dict[str, Any] = {
            "kind": summaries[0]["kind"],
            "final": spread([s["final"]["score"] for s in summaries]),
            "per_class": {str(k): spread([f.get(k, 0.0) for f in finals]) for k in classes},
            "time_to_s": {f"{t:g}": spread([time_to(c, t) for c in curves]) for t in thresholds},
            "applied": spread([s["updates"]["applied"] for s in summaries]),
            "dropped": spread([s["updates"]["dropped"] for s in summaries]),
            "never_applied": spread([s["acceptance"]["clients_never_applied"] for s in summaries]),
            "early_loss_step_std": spread([s["jitter"]["early_loss_step_std"] for s in summaries]),
            "late_loss_step_std": spread([s["jitter"]["loss_step_std"] for s in summaries]),
            "loss_std": spread([s["jitter"]["loss_std"] for s in summaries]),
        }
        if config.attack is not None:  # only then: other aggregates keep their bytes
            attacks = [s["attack"] for s in summaries]
            entry["attack"] = {
                key: spread([a[key] for a in attacks])
                for key in ("malicious_acceptance", "honest_acceptance", "backdoor_success")
            }
        privacy = [s.get("privacy") for s in summaries]
        if privacy[0] is not None:  # DP arms only, likewise
            entry["privacy"] = {
                key: spread([p[key] for p in privacy])
                for key in ("epsilon_sampled", "epsilon_conservative", "noised_steps")
            }
        if rare is not None:
            entry["rare_class"] = entry["per_class"].get(str(rare))
            entry["other_classes"] = spread(
                [float(np.mean([f.get(k, 0.0) for k in classes if k != rare])) for f in finals]
            )
        algorithms[name] = entry
    return {
        "name": config.name,
        "seeds": [run.seed for run in runs],
        "target": config.eval.target,
        "rare_class": rare,
        "thresholds": thresholds,
        "algorithms": algorithms,
    } | ({} if config.attack is None else {"attack": config.attack.model_dump(mode="json")})


def _pm(s: dict[str, Any] | None, digits: int = 3, scale: float = 1.0) -> str:
    if s is None or s["mean"] is None:
        return "–"
    mean = s["mean"] / scale
    text = f"{mean:.{digits}f}"
    if s["sd"] is not None:
        text += f" ± {s['sd'] / scale:.{digits}f}"
    total = len(s["values"])
    if s["n"] < total:
        text += f" ({s['n']}/{total})"
    return text


def _minutes(s: dict[str, Any]) -> str:
    return "not reached" if s["n"] == 0 else _pm(s, 1, 60.0)


def tables(result: dict[str, Any]) -> str:
    """seeds.md: the summary table, the per-class table and the per-seed values."""
    seeds = result["seeds"]
    rare = result["rare_class"]
    thresholds = result["thresholds"]
    lines = [
        f"# `{result['name']}` over {len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        "mean ± sample sd over the seeds; times in simulated minutes, over the seeds that reached "
        "the threshold (how many did, when not all).",
        "",
    ]
    head = ["algorithm", "final accuracy"]
    if rare is not None:
        head += [f"class {rare}", "other classes"]
    head += [f"to {t:g}" for t in thresholds] + ["applied", "never applied"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, a in result["algorithms"].items():
        row = [name, _pm(a["final"])]
        if rare is not None:
            row += [_pm(a["rare_class"]), _pm(a["other_classes"])]
        row += [_minutes(a["time_to_s"][f"{t:g}"]) for t in thresholds]
        row += [_pm(a["applied"], 0), _pm(a["never_applied"], 1)]
        lines.append("| " + " | ".join(row) + " |")
    classes = list(next(iter(result["algorithms"].values()))["per_class"])
    lines += ["", "Final accuracy per class:", ""]
    lines += ["| algorithm | " + " | ".join(classes) + " |", "|" + "---|" * (len(classes) + 1)]
    for name, a in result["algorithms"].items():
        cells = [_pm(a["per_class"][k], 2) for k in classes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Loss jitter (σ of successive test-loss differences, and σ of the loss):", ""]
    lines += ["| algorithm | early step σ | late step σ | late loss σ |", "|---|---|---|---|"]
    for name, a in result["algorithms"].items():
        lines.append(
            f"| {name} | {_pm(a['early_loss_step_std'], 4)} | {_pm(a['late_loss_step_std'], 4)}"
            f" | {_pm(a['loss_std'], 4)} |"
        )
    if "attack" in result:
        attack = result["attack"]
        lines += ["", f"Attack `{attack['kind']}` by {attack['share']:.0%} of the devices:", ""]
        lines += [
            "| algorithm | malicious acceptance | honest acceptance | backdoor success |",
            "|---|---|---|---|",
        ]
        for name, a in result["algorithms"].items():
            cells = [_pm(a["attack"][k]) for k in a["attack"]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    private = {name: a["privacy"] for name, a in result["algorithms"].items() if "privacy" in a}
    if private:
        lines += ["", "Privacy spent at the end (ε at the arm's δ, by accounting model):", ""]
        lines += ["| algorithm | final accuracy | ε sampled | ε conservative | noised steps |"]
        lines += ["|---|---|---|---|---|"]
        for name, p in private.items():
            final = _pm(result["algorithms"][name]["final"])
            lines.append(
                f"| {name} | {final} | {_pm(p['epsilon_sampled'], 2)} | "
                f"{_pm(p['epsilon_conservative'], 2)} | {_pm(p['noised_steps'], 0)} |"
            )
    lines += ["", "Per seed:", ""]
    target = f"{result['target']:g}" if result["target"] else None
    for name, a in result["algorithms"].items():
        finals = ", ".join(f"{v:.3f}" for v in a["final"]["values"])
        text = f"- {name}: final {finals}"
        if rare is not None:
            text += "; class " + str(rare) + " "
            text += ", ".join(f"{v:.3f}" for v in a["rare_class"]["values"])
        if target is not None:
            times = a["time_to_s"][target]["values"]
            text += f"; to {target} " + ", ".join(
                "–" if t is None else f"{t / 60:.0f}" for t in times
            )
        lines.append(text)
    return "\n".join(lines) + "\n"


def per_class_chart(runs: Sequence[SeedRun], result: dict[str, Any], out: Path) -> str:
    """Each algorithm's per-class test accuracy over simulated time, mean over the seeds (the
    rare class drawn thick)."""
    import matplotlib

    from fedasync.shared.charts import new_figure
    from fedasync.sim.plots import save_png

    names = list(result["algorithms"])
    rare = result["rare_class"]
    columns = 2
    rows = math.ceil(len(names) / columns)
    figure = new_figure(width=10.0, height=2.6 * rows + 0.8)
    axes = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        curves = [run.curves[name] for run in runs]
        length = min(len(c) for c in curves)
        times = [t / 60 for t, _, _ in curves[0][:length]]
        classes = sorted(curves[0][-1][2])
        palette = matplotlib.colormaps["viridis"]
        for k in classes:
            mean = np.mean([[p[2].get(k, 0.0) for p in c[:length]] for c in curves], axis=0)
            thick = k == rare
            ax.plot(
                times,
                mean,
                linewidth=2.5 if thick else 0.8,
                color="tab:red" if thick else palette(k / max(1, len(classes) - 1)),
                alpha=1.0 if thick else 0.6,
                label=f"class {k}" if thick else None,
            )
        overall = np.mean([[p[1] for p in c[:length]] for c in curves], axis=0)
        ax.plot(times, overall, color="black", linestyle="--", linewidth=1.2, label="overall")
        ax.set_title(name)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    for ax in axes[-columns:]:
        ax.set_xlabel("simulated time (min)")
    for ax in axes[::columns]:
        ax.set_ylabel("test accuracy")
    figure.suptitle(
        f"Per-class test accuracy over time, mean of {len(runs)} seeds"
        + (f" (class {rare} thick, the others thin)" if rare is not None else "")
    )
    return save_png(figure, out / "per_class_time.png")


def write_seeds(runs: Sequence[SeedRun], config: SimConfig, out: Path) -> dict[str, Any]:
    """seeds.json, seeds.md and the per-class chart; returns the aggregate."""
    out.mkdir(parents=True, exist_ok=True)
    result = aggregate(runs, config)
    (out / "seeds.json").write_text(dumps(result))
    (out / "seeds.md").write_text(tables(result))
    per_class_chart(runs, result, out)
    return result


def configs_for(config: SimConfig, seeds: int) -> list[SimConfig]:
    """The config at seeds config.seed, config.seed + 1, …"""
    return [config.model_copy(update={"seed": config.seed + k}) for k in range(seeds)]
