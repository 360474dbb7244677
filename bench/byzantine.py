"""The `byzantine` preset under each attack of docs/experiments.md, and the defences' table.

The preset holds one fleet, one attack (20% sign-flipping) and every defence as an arm. A claim
about defences needs the attack varied, not the defence alone, so this runs the preset once per
*cell*: no attack, then sign-flip, scale (×10), noise and a backdoor, each by 10% and by 20% of
the devices, every cell over the same seeds (`fedasync simulate --seeds`, so each cell's folder
is what that command writes: seed<k>/, seeds.json, seeds.md). Only the `[attack]` table differs
between cells; the malicious devices are drawn from the seed, so within a cell every arm faces
the same attackers.

Flower's strategies run on the preset's FedAvg arm with the same cells through
bench/flower_side.py (`--attack KIND --share S`, in Flower's virtualenv); `table` puts both side
by side:

    .venv/bin/python bench/byzantine.py run --seeds 5 --jobs 2 --out runs/byzantine
    /tmp/flwr-venv/bin/python bench/byzantine.py flower --seeds 5 --out runs/byzantine
    .venv/bin/python bench/byzantine.py table --out runs/byzantine

`--smoke` shrinks the fleet and the budget to seconds (it checks that the bench runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import flower_side  # bench/, beside this file; it imports flwr only when a Flower run starts

PRESET = "byzantine"

#: cell → the `[attack]` table it runs with (None: no attack)
CELLS: dict[str, dict[str, Any] | None] = {
    "none": None,
    **{
        f"{kind}-{share:.0%}": {"kind": kind, "share": share}
        for kind in ("sign_flip", "scale", "noise", "backdoor")
        for share in (0.1, 0.2)
    },
}

#: Flower's strategies on the FedAvg arm; f = 2 for Krum, as the preset's Krum arms assume
FLOWER = ("fedavg", "fedmedian", "krum", "multi-krum")


def cell_data(cell: str, *, smoke: bool = False) -> dict[str, Any]:
    """The preset's data with the cell's attack (or none) in place of its own."""
    from fedasync.sim.config import merge

    data = flower_side.with_attack(PRESET, CELLS[cell])
    data["name"] = f"{PRESET}-{cell}"
    return merge(data, flower_side.SMOKE) if smoke else data


def run(out: Path, cells: list[str], seeds: int, jobs: int, smoke: bool) -> None:
    """Each cell over `seeds` seeds (from the preset's seed), in out/ours/<cell>/."""
    from fedasync.sim.config import build
    from fedasync.sim.multiseed import configs_for, run_seeds, write_seeds

    for cell in cells:
        config = build(cell_data(cell, smoke=smoke))
        folder = out / "ours" / cell
        runs = run_seeds(configs_for(config, seeds), folder, jobs=jobs, plots=False)
        write_seeds(runs, config, folder)
        print(f"{cell}: wrote {folder / 'seeds.md'}", flush=True)


def flower(out: Path, cells: list[str], seeds: int, smoke: bool) -> None:
    """Flower's strategies on the FedAvg arm of each cell, in out/flower/ (Flower's venv)."""
    from fedasync.sim.config import build

    folder = out / "flower"
    folder.mkdir(parents=True, exist_ok=True)
    start = build(cell_data("none")).seed  # the seeds `run` uses
    for cell in cells:
        for strategy in FLOWER:
            for seed in range(start, start + seeds):
                one = flower_side.run(
                    PRESET,
                    "fedavg",
                    strategy,
                    seed,
                    smoke,
                    {"robust_byzantine": 2},
                    attack=CELLS[cell],
                )
                one["cell"] = cell
                name = f"{cell}-{strategy}-seed{seed}.json"
                (folder / name).write_text(json.dumps(one, indent=1) + "\n")
                print(json.dumps(one), flush=True)


def _ours(out: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for cell in CELLS:
        path = out / "ours" / cell / "seeds.json"
        if path.exists():
            found[cell] = json.loads(path.read_text())
    return found


def _flower(out: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted((out / "flower").glob("*.json")):
        one = json.loads(path.read_text())
        found.setdefault((one["cell"], one["strategy"]), []).append(one)
    return found


def table(out: Path) -> str:
    """Final accuracy per arm and cell (mean ± sd over the seeds), and the backdoor's success."""
    ours, theirs = _ours(out), _flower(out)
    cells = [c for c in CELLS if c in ours or any(k[0] == c for k in theirs)]
    arms = [a["name"] for a in cell_data("none")["algorithms"]]  # in the preset's order
    seeds = {len(r["seeds"]) for r in ours.values()} | {len(v) for v in theirs.values()}

    def grid(title: str, ours_cell: Any, flower_cell: Any, shown: list[str]) -> list[str]:
        lines = ["", title, "", "| server | arm | " + " | ".join(shown) + " |"]
        lines.append("|---|---|" + "---|" * len(shown))
        for arm in arms:
            row = [ours_cell(ours.get(c, {}).get("algorithms", {}).get(arm)) for c in shown]
            lines.append(f"| ours | {arm} | " + " | ".join(row) + " |")
        for strategy in FLOWER:
            row = [flower_cell(theirs.get((c, strategy), [])) for c in shown]
            if any(cell != "–" for cell in row):
                lines.append(f"| Flower 1.42 {strategy} | fedavg | " + " | ".join(row) + " |")
        return lines

    def accuracy(entry: dict[str, Any] | None) -> str:
        return "–" if entry is None else flower_side._spread(entry["final"]["values"])

    def flower_accuracy(runs: list[dict[str, Any]]) -> str:
        return flower_side._spread([r["final_accuracy"] for r in runs])

    def success(entry: dict[str, Any] | None) -> str:
        if entry is None or "attack" not in entry:
            return "–"
        values = entry["attack"]["backdoor_success"]["values"]
        return flower_side._spread([v for v in values if v is not None])

    def flower_success(runs: list[dict[str, Any]]) -> str:
        return flower_side._spread([r["backdoor_success"] for r in runs if "backdoor_success" in r])

    lines = [f"# `{PRESET}` per attack, seeds per cell: {sorted(seeds)}"]
    lines += grid("Final accuracy (mean ± sd over the seeds):", accuracy, flower_accuracy, cells)
    backdoor = [c for c in cells if c.startswith("backdoor")]
    if backdoor:
        lines += grid(
            "Backdoor success (share of triggered test inputs classified as the target):",
            success,
            flower_success,
            backdoor,
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "flower", "table"))
    parser.add_argument("--out", type=Path, default=Path("runs/byzantine"))
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell, from the preset's")
    parser.add_argument("--jobs", type=int, default=1, help="run: seeds simulated at once")
    parser.add_argument("--smoke", action="store_true", help="seconds per cell: flower_side.SMOKE")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.cells, args.seeds, args.jobs, args.smoke)
    elif args.command == "flower":
        flower(args.out, args.cells, args.seeds, args.smoke)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
