"""What DP-SGD on the device costs: time per local run, ε per run count, accuracy in the simulator.

Three tables (docs/your-model.md, "DP-SGD on the device"):
1. one device's local run of the digits MLP, plain SGD against DP-SGD (Opacus), median of
   `--repeat` runs, after one warm-up run of each;
2. that device's ε at δ after 1, 10, 50 and 200 runs for several σ, from Opacus's RDP accountant
   (the accountant each device keeps, learning/dpsgd.py);
3. with `--updates N` (> 0): FedAsync on `--devices` IID digits devices in the simulator for N
   updates, final accuracy and the fleet's worst ε, without DP-SGD and at each `--sigmas`.

Run: python bench/dpsgd.py [--devices 20] [--repeat 10] [--updates 600] [--sigmas 1.0 0.6]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np
from opacus.accountants import RDPAccountant

from fedasync.learning.digits import DigitsMLP
from fedasync.learning.dpsgd import DPSGD, DeviceAccountant
from fedasync.sim.config import build
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary

EPOCHS, BATCH, LR, DELTA = 2, 16, 0.1, 1e-5


def run_times(devices: int, repeat: int) -> tuple[int, float, float]:
    """(samples, plain s, DP-SGD s): medians of one device's local run."""
    task = DigitsMLP()
    train, _ = task.dataset(np.random.default_rng(0))
    data = train.subset(np.arange(len(train) // devices))
    weights = task.init_weights(np.random.default_rng(1))
    accountant = DeviceAccountant(DPSGD(1.0, 1.0, DELTA))
    medians = []
    kinds: list[dict[str, Any]] = [{}, {"privacy": accountant}]
    for extra in kinds:
        seconds = []
        for i in range(repeat + 1):  # the first warms up (and imports Opacus)
            started = time.perf_counter()
            task.train(
                weights,
                data,
                np.random.default_rng(i),
                epochs=EPOCHS,
                lr=LR,
                batch_size=BATCH,
                **extra,
            )
            seconds.append(time.perf_counter() - started)
        medians.append(statistics.median(seconds[1:]))
    return len(data), medians[0], medians[1]


def epsilon(samples: int, sigma: float, runs: int) -> float:
    per_epoch = math.ceil(samples / BATCH)
    accountant = RDPAccountant()
    accountant.history = [(sigma, 1 / per_epoch, runs * EPOCHS * per_epoch)]
    return float(accountant.get_epsilon(delta=DELTA))


def accuracy(devices: int, updates: int, sigma: float | None) -> tuple[float, Any]:
    training: dict[str, Any] = {"epochs": EPOCHS, "lr": LR, "batch_size": BATCH}
    if sigma is not None:
        training["dpsgd"] = {"noise_multiplier": sigma, "max_grad_norm": 1.0, "delta": DELTA}
    config = build(
        {
            "name": "dpsgd-bench",
            "seed": 1,
            "task": {"name": "digits", "params": {"hidden": 32}},
            "training": training,
            "data": {"partition": "iid"},
            "fleet": {"devices": devices, "latency": {"kind": "longtail", "jitter": 0.2}},
            "budget": {"max_updates": updates, "max_seconds": 86400},
            "eval": {"interval_s": 60},
            "algorithms": [{"kind": "fedasync", "name": "fedasync", "tau_max": 10}],
        }
    )
    summary = build_summary(simulate(config))["algorithms"]["fedasync"]
    privacy = summary.get("device_privacy")
    return float(summary["final"]["score"]), None if privacy is None else privacy["worst_epsilon"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="fleet the data is split over")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs of each kind")
    parser.add_argument("--updates", type=int, default=0, help="simulated updates; 0: skip")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 0.6])
    args = parser.parse_args()

    samples, plain, private = run_times(args.devices, args.repeat)
    print(f"one local run: {samples} samples, {EPOCHS} epochs, batch {BATCH}")
    print(f"{'':>10} {'s/run':>10}")
    print(f"{'plain':>10} {plain:>10.4f}")
    print(f"{'dp-sgd':>10} {private:>10.4f}   ({private / plain:.0f}x)")
    print()
    counts = (1, 10, 50, 200)
    print(
        f"ε at δ = {DELTA:g} after k runs ({samples} samples, q = 1/{math.ceil(samples / BATCH)})"
    )
    print(f"{'σ':>6} " + " ".join(f"{k:>8}" for k in counts))
    for sigma in (0.8, 1.0, 1.5, 2.0):
        row = " ".join(f"{epsilon(samples, sigma, k):>8.2f}" for k in counts)
        print(f"{sigma:>6} {row}")
    if args.updates > 0:
        print()
        print(f"FedAsync, {args.devices} IID devices, {args.updates} updates")
        print(f"{'σ':>6} {'accuracy':>10} {'worst ε':>10}")
        for sigma in (None, *args.sigmas):
            score, worst = accuracy(args.devices, args.updates, sigma)
            shown = "–" if worst is None else f"{worst:.2f}"
            print(f"{'off' if sigma is None else sigma:>6} {score:>10.3f} {shown:>10}")


if __name__ == "__main__":
    main()
