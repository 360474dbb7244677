"""Simulator throughput: simulated updates per wall-clock second, and where the time goes.

For the linear task (numpy, tiny) and digits (torch MLP), one FedAsync run on the long-tail
fleet: updates decided per second of wall time, and the shares of wall time spent in local
training, in evaluation, and in everything else (event loop, snapshots, the core's apply):
the engine overhead. Reports figures; asserts nothing.
Run: python bench/simulator.py [--updates 3000] [--devices 50]

With several `--devices` (issue 16), the cost growth instead: for each fleet size, in a fresh
child process, the linear task on the long-tail fleet with every device training at once and
the advised τ_max, run to `--updates` applied updates (default 20,000); wall time, peak
resident memory of the child (`getrusage`), local trainings run, updates decided and applied.
`--preset million-devices` adds that preset's run as a last row.
Run: python bench/simulator.py --devices 1000 10000 100000 1000000 [--preset million-devices]

With `--config FILE` (issue 29), the growth of any configuration instead: the file as
`fedasync simulate --config FILE` reads it, with only `fleet.devices` set to each of
`--devices` and `budget.max_updates` to `--updates` (when given), each row in a fresh child
process; wall time and peak memory, each also as a ratio to the first row's. Repeat `--config`
for one table per file, in one run. `--profile DIR` keeps each row's cProfile there.
Run: python bench/simulator.py --config bench/configs/fedasync-longtail.toml \
        --devices 1000 10000 100000 --updates 20000
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import machine

from fedasync.learning.dataset import Dataset
from fedasync.learning.evaluation import Evaluation
from fedasync.learning.task import Task
from fedasync.sim.config import SimConfig, build, load_config
from fedasync.sim.config import label as cfg_label
from fedasync.sim.runner import simulate
from fedasync.sim.world import build_world


class Timed(Task):
    """Delegates to a task and adds up the wall time of train and evaluate."""

    def __init__(self, inner: Task) -> None:
        self.inner = inner
        self.name, self.layout = inner.name, inner.layout
        self.num_classes, self.suggested = inner.num_classes, inner.suggested
        self.train_s = 0.0
        self.eval_s = 0.0

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        return self.inner.init_weights(rng)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        return self.inner.dataset(rng)

    def train(self, weights: np.ndarray, data: Dataset, rng: np.random.Generator, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner.train(weights, data, rng, **kw)
        finally:
            self.train_s += time.perf_counter() - start

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        start = time.perf_counter()
        try:
            return self.inner.evaluate(weights, data)
        finally:
            self.eval_s += time.perf_counter() - start


def measure(task: str, updates: int, devices: int) -> dict[str, float]:
    config = build(
        {
            "task": {"name": task},
            "fleet": {"devices": devices, "latency": {"kind": "longtail"}},
            "budget": {"max_updates": updates, "max_seconds": 10**7},
            "eval": {"interval_s": 60},
            "algorithms": [{"kind": "fedasync", "tau_max": "auto"}],
        }
    )
    world = build_world(config)
    timed = Timed(world.task)
    object.__setattr__(world, "task", timed)  # the bench's only liberty: a timing wrapper
    start = time.perf_counter()
    result = simulate(config, world=world).results[0]
    wall = time.perf_counter() - start
    decided = len(result.recorder.decisions)
    return {
        "decided": decided,
        "wall_s": wall,
        "per_s": decided / wall,
        "train": timed.train_s / wall,
        "eval": timed.eval_s / wall,
        "engine": (wall - timed.train_s - timed.eval_s) / wall,
        "sim_per_wall": result.end_s / wall,
    }


def growth_config(devices: int, updates: int) -> SimConfig:
    """The issue's fleet: `devices` long-tail devices, all training, linear task, τ_max auto.

    The linear task's data grows with the fleet (the partition needs a sample per device):
    1.25 samples per device, at least the task's default 6,000.
    """
    return build(
        {
            "name": f"growth-{devices}",
            "task": {"name": "linear", "params": {"samples": max(6000, devices * 5 // 4)}},
            "fleet": {"devices": devices, "latency": {"kind": "longtail"}},
            "budget": {"max_updates": updates, "max_seconds": 10**7},
            "eval": {"interval_s": 60},
            "algorithms": [{"kind": "fedasync", "tau_max": "auto"}],
        }
    )


def one_run(config: SimConfig, queue: Any, profile: Path | None = None) -> None:
    """In a child process: simulate, then report figures and this process's peak RSS."""
    profiler = cProfile.Profile() if profile is not None else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = simulate(config).results[0]
    wall = time.perf_counter() - start
    if profiler is not None and profile is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    queue.put(
        {
            "devices": config.fleet.devices,
            "wall_s": wall,
            "peak_mb": peak_kib * 1024 / 1e6,
            "trainings": result.trainings,
            "decided": len(result.recorder.decisions),
            "applied": result.recorder.updates_applied,
            "simulated_s": result.end_s,
        }
    )


def in_child(config: SimConfig, profile: Path | None = None) -> dict[str, Any]:
    """Run in a fresh process, so each row's peak memory is its own."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=one_run, args=(config, queue, profile))
    child.start()
    child.join()  # the row is a few numbers: the queue's pipe holds it until read
    if child.exitcode != 0:
        raise SystemExit(f"the run of {config.fleet.devices} devices failed ({child.exitcode})")
    row: dict[str, Any] = queue.get(timeout=10)
    return row


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine skews wall times."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def growth(sizes: list[int], updates: int, presets: list[str]) -> None:
    configs = [(f"{n:,}", growth_config(n, updates)) for n in sizes]
    configs += [(name, load_config(preset=name)) for name in presets]
    print(f"load average before: {load_average()}")
    print(
        f"| {'run':>16} | {'devices':>9} | {'wall s':>7} | {'peak MB':>7} | {'trainings':>9}"
        f" | {'decided':>10} | {'applied':>8} | {'simulated s':>11} |"
    )
    print(
        f"|{'-' * 18}|{'-' * 11}|{'-' * 9}|{'-' * 9}|{'-' * 11}|{'-' * 12}|{'-' * 10}|{'-' * 13}|"
    )
    for name, config in configs:
        r = in_child(config)
        print(
            f"| {name:>16} | {r['devices']:>9,} | {r['wall_s']:>7.1f} | {r['peak_mb']:>7.0f}"
            f" | {r['trainings']:>9,} | {r['decided']:>10,} | {r['applied']:>8,}"
            f" | {r['simulated_s']:>11,.0f} |",
            flush=True,
        )
    print(f"load average after: {load_average()}")


def sized(base: SimConfig, devices: int, updates: int | None) -> SimConfig:
    """`base` with `devices` devices and, if given, `updates` applied updates; nothing else."""
    data = base.model_dump(mode="json")  # base_dir included: trace paths resolve as before
    data["name"] = f"{base.name}-{devices}"
    data["fleet"]["devices"] = devices
    if updates is not None:
        data["budget"]["max_updates"] = updates
    return build(data)


def config_growth(path: Path, sizes: list[int], updates: int | None, profiles: Path | None) -> None:
    """One table for the configuration in `path`: a row per fleet size, ratios to the first."""
    base = load_config(path)
    print(f"\nconfig {path} ({base.name}): {', '.join(cfg_label(a) for a in base.algorithms)}")
    print(
        f"| {'devices':>9} | {'wall s':>7} | {'× first':>7} | {'peak MB':>7} | {'× first':>7}"
        f" | {'trainings':>9} | {'decided':>10} | {'applied':>8} | {'simulated s':>11} |"
    )
    print("|" + "|".join("-" * (w + 2) for w in (9, 7, 7, 7, 7, 9, 10, 8, 11)) + "|")
    first: dict[str, Any] | None = None
    for n in sizes:
        profile = None if profiles is None else profiles / f"{base.name}-{n}.pstats"
        r = in_child(sized(base, n, updates), profile)
        first = first or r
        print(
            f"| {r['devices']:>9,} | {r['wall_s']:>7.1f} | {r['wall_s'] / first['wall_s']:>7.2f}"
            f" | {r['peak_mb']:>7.0f} | {r['peak_mb'] / first['peak_mb']:>7.2f}"
            f" | {r['trainings']:>9,} | {r['decided']:>10,} | {r['applied']:>8,}"
            f" | {r['simulated_s']:>11,.0f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=None)
    parser.add_argument("--devices", type=int, nargs="+", default=[50])
    parser.add_argument("--preset", action="append", default=[], help="add a preset's run")
    parser.add_argument(
        "--config", type=Path, action="append", default=[], help="grow this config file's fleet"
    )
    parser.add_argument("--profile", type=Path, help="with --config: keep each row's cProfile")
    args = parser.parse_args()
    if args.config:
        print(machine(), flush=True)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        for path in args.config:
            config_growth(path, args.devices, args.updates, args.profile)
        print(f"\n{machine()}")
        return
    if len(args.devices) > 1 or args.preset:
        growth(args.devices, args.updates or 20_000, args.preset)
        return
    updates = args.updates or 3000
    print(
        f"{'task':>8} {'updates':>8} {'wall s':>7} {'updates/s':>10} {'sim s/wall s':>13}"
        f" {'training':>9} {'evaluation':>11} {'engine':>7}"
    )
    for task in ("linear", "digits"):
        m = measure(task, updates, args.devices[0])
        print(
            f"{task:>8} {m['decided']:>8.0f} {m['wall_s']:>7.2f} {m['per_s']:>10.0f}"
            f" {m['sim_per_wall']:>13.0f} {m['train']:>9.1%} {m['eval']:>11.1%}"
            f" {m['engine']:>7.1%}"
        )


if __name__ == "__main__":
    main()
