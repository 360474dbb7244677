"""Flower's server strategies on our fleet: same devices, data, rounds, attackers; only the server.

Flower (flwr 1.42) has no asynchronous mode, so its figures stand beside our synchronous FedAvg
arm of the same preset: our simulator (sim/synchronous.py) runs the rounds, selects the same
devices, trains them from the same model with the same seeds, and hands the round's kept results
to Flower's own server code instead of our average (`SyncRun.aggregate`): its strategy's
`configure_fit` (where a DP wrapper records the round's model) and `aggregate_fit` (clipping,
noise, median, Krum), exactly as Flower's server loop calls them. So a difference in accuracy is a
difference in the server's rule and nothing else.

The strategies:

- `fedavg`: Flower's `FedAvg`, weighted by examples as ours is (a check: the same figures);
- `dp-fixed`: `DifferentialPrivacyServerSideFixedClipping(FedAvg, z, C, m)`: each update clipped
  to C against the round's model, Gaussian noise of std z·C/m on the average;
- `fedmedian`: `FedMedian` (coordinate-wise median);
- `krum`: `Krum(num_malicious_clients=f)`, one model kept; `multi-krum`: the m best averaged.

Flower draws its noise from NumPy's global generator; it is seeded from the run's seed before each
run, so a Flower run is repeatable too.

flwr pulls in a server stack of its own (gRPC, FastAPI, SQLAlchemy, uv), so it runs in its own
virtualenv, never the project's:

    python3 -m venv /tmp/flwr-venv
    /tmp/flwr-venv/bin/pip install torch==2.13.0
    /tmp/flwr-venv/bin/pip install flwr==1.42.0 -e ".[sim]"

Then, for a preset's fedavg arm (docs/experiments.md has the tables):

    /tmp/flwr-venv/bin/python bench/flower_side.py run --preset NAME --algorithm ARM \\
        --strategy dp-fixed --seeds 0 1 2 3 4 --out runs/flower
    .venv/bin/python bench/flower_side.py table runs/flower

`--smoke` shrinks a run to seconds; tests/test_benches.py runs it where FLOWER_PYTHON names
Flower's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

STRATEGIES = ("fedavg", "dp-fixed", "fedmedian", "krum", "multi-krum")

#: --smoke: a few seconds per run; it checks that the bench runs, not what it finds
SMOKE: dict[str, Any] = {
    "task": {"name": "digits", "params": {"hidden": 8}},
    "training": {"epochs": 1, "batch_size": 32},
    "fleet": {"devices": 12},
    "budget": {"max_updates": 40},
}


class FlowerServer:
    """One Flower strategy driven as Flower's server loop drives it, one round at a time."""

    def __init__(self, strategy: str, clients: int, settings: dict[str, Any]) -> None:
        from flwr.server.client_manager import SimpleClientManager
        from flwr.server.strategy import (
            DifferentialPrivacyServerSideFixedClipping,
            FedAvg,
            FedMedian,
            Krum,
        )

        m = int(settings["clients_per_round"])
        common = {"fraction_fit": 1.0, "min_fit_clients": m, "min_available_clients": m}
        if strategy == "fedavg":
            self.strategy: Any = FedAvg(**common)
        elif strategy == "dp-fixed":
            self.strategy = DifferentialPrivacyServerSideFixedClipping(
                FedAvg(**common),
                noise_multiplier=float(settings["dp_noise"]),
                clipping_norm=float(settings["dp_clip"]),
                num_sampled_clients=m,
            )
        elif strategy == "fedmedian":
            self.strategy = FedMedian(**common)
        elif strategy in ("krum", "multi-krum"):
            f = int(settings.get("robust_byzantine") or 1)
            keep = int(settings.get("robust_select") or m - f)
            self.strategy = Krum(
                **common,
                num_malicious_clients=f,
                num_clients_to_keep=keep if strategy == "multi-krum" else 0,
            )
        else:
            raise ValueError(f"unknown strategy {strategy!r}: one of {STRATEGIES}")
        self.manager = SimpleClientManager()
        self.proxies = [_proxy(f"c{i}") for i in range(clients)]
        for proxy in self.proxies:
            self.manager.register(proxy)
        self.round = 0

    def aggregate(self, model: np.ndarray, models: list[np.ndarray], counts: list[int]) -> Any:
        """The round's new model from its kept results, as Flower's server computes it."""
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

        self.round += 1
        parameters = ndarrays_to_parameters([np.asarray(model, dtype=np.float32)])
        # configure_fit records the round's model (the DP wrapper clips against it); its own
        # choice of clients is Flower's, and the simulator's choice is what trains
        self.strategy.configure_fit(self.round, parameters, self.manager)
        results = [
            (
                self.proxies[i],
                FitRes(
                    status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters([np.asarray(w, dtype=np.float32)]),
                    num_examples=int(n),
                    metrics={},
                ),
            )
            for i, (w, n) in enumerate(zip(models, counts, strict=True))
        ]
        aggregated, _ = self.strategy.aggregate_fit(self.round, results, [])
        if aggregated is None:  # Flower refuses the round (e.g. too few results for Krum)
            return np.asarray(model, dtype=np.float32)
        (weights,) = parameters_to_ndarrays(aggregated)
        return np.asarray(weights, dtype=np.float32).reshape(-1)


def _proxy(cid: str) -> Any:
    from flwr.server.client_proxy import ClientProxy

    class Proxy(ClientProxy):  # type: ignore[misc]  # Flower's untyped base
        """A client the manager can list; the simulator trains, so it is never called."""

        def get_properties(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def get_parameters(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def fit(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def reconnect(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return Proxy(cid)


#: `attack` of `config_for` and `run`: the preset's own `[attack]` table (or none, if it has none)
AS_PRESET = "as-preset"


def with_attack(preset: str, attack: dict[str, Any] | str | None = AS_PRESET) -> dict[str, Any]:
    """The preset's data with `attack` (an `[attack]` table, None for no attack) in place of
    its own, or as it is (AS_PRESET)."""
    from fedasync.sim.presets import preset_data

    data = preset_data(preset)
    if attack != AS_PRESET:
        data.pop("attack", None)
        if isinstance(attack, dict):
            data["attack"] = dict(attack)
    return data


def config_for(
    preset: str,
    algorithm: str,
    seed: int,
    *,
    smoke: bool = False,
    attack: dict[str, Any] | str | None = AS_PRESET,
) -> Any:
    """The simulator config of one run: the preset with only its fedavg arm `algorithm`, and
    `attack` in place of the preset's own (`with_attack`)."""
    from fedasync.sim.config import build, merge

    data = with_attack(preset, attack)
    arms = [a for a in data["algorithms"] if a.get("name") == algorithm]
    if not arms or arms[0]["kind"] != "fedavg":
        names = [a.get("name") for a in data["algorithms"] if a["kind"] == "fedavg"]
        raise SystemExit(f"{preset} has no fedavg arm {algorithm!r}: its fedavg arms are {names}")
    data["algorithms"] = arms
    data["seed"] = seed
    return build(merge(data, SMOKE) if smoke else data)


def run(
    preset: str,
    algorithm: str,
    strategy: str,
    seed: int,
    smoke: bool,
    server_settings: dict[str, Any] | None = None,
    attack: dict[str, Any] | str | None = AS_PRESET,
) -> dict[str, Any]:
    """One seed of a preset's fedavg arm with Flower's `strategy` (or ours: `strategy` ours).

    `server_settings` (dp_clip, dp_noise, robust_byzantine, robust_select) override the arm's
    own fields of the same names, for a Flower strategy that needs what our arm lacks; `attack`
    as in `config_for`. A DP arm's rounds are accounted as ours are (`SyncRun._account`: the
    same devices, rounds, C and z), so its ε is reported beside the accuracy."""
    from fedasync.sim.synchronous import SyncRun
    from fedasync.sim.world import build_world

    config = config_for(preset, algorithm, seed, smoke=smoke, attack=attack)
    world = build_world(config)
    spec = config.algorithms[0]
    sync = SyncRun(spec, world)
    if strategy != "ours":
        # the DP fields by attribute: the dump leaves them out at their defaults (z = 1)
        dp = {"dp_clip": spec.dp_clip, "dp_noise": spec.dp_noise}
        settings = spec.model_dump(mode="json") | dp | (server_settings or {})
        server = FlowerServer(strategy, world.num_devices, settings)
        random.seed(seed)  # Flower samples clients with `random` (unused here) and noises with
        np.random.seed(seed)  # NumPy's global generator: seeded, a Flower run repeats exactly

        def aggregate(
            models: list[np.ndarray], counts: list[int], clients: list[str]
        ) -> np.ndarray:
            out: np.ndarray = server.aggregate(sync.weights, models, counts)
            return out

        sync.aggregate = aggregate  # type: ignore[method-assign]  # the one seam, per instance
    started = time.perf_counter()
    result = sync.run()
    recorder = result.recorder
    return {
        "preset": preset,
        "algorithm": algorithm,
        "strategy": strategy,
        "seed": seed,
        "under_attack": "none"
        if config.attack is None
        else f"{config.attack.kind} {config.attack.share:.0%}",
        "final_accuracy": recorder.evals[-1].score,
        "applied": recorder.updates_applied,
        "rounds": result.version,
        "ended_by": result.ended_by,
        "wall_s": round(time.perf_counter() - started, 1),
        **_attack_success(result),
        **_epsilon(result),
    }


def _attack_success(result: Any) -> dict[str, Any]:
    """The backdoor's success on the final model, where the run has a backdoor attack."""
    success = result.attack_success
    return {} if success is None else {"backdoor_success": success}


#: what a DP run's record carries of its privacy summary
EPSILON = ("epsilon_sampled", "epsilon_conservative", "noised_steps")


def _epsilon(result: Any) -> dict[str, Any]:
    """ε spent by a DP arm's rounds, under both accounting models."""
    privacy = result.privacy
    if privacy is None:
        return {}
    return {k: privacy[k] for k in EPSILON}


def table(folder: Path) -> str:
    rows: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        one = json.loads(path.read_text())
        key = (one["preset"], one["algorithm"], one.get("under_attack", "–"), one["strategy"])
        rows.setdefault(key, []).append(one)
    lines = [
        "| preset | arm | attack | server | seeds | final accuracy (mean ± sd) | per seed | "
        "rounds | ε sampled | ε conservative |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(rows):
        runs = sorted(rows[key], key=lambda r: r["seed"])
        scores = [r["final_accuracy"] for r in runs]
        server = "ours" if key[3] == "ours" else f"Flower 1.42 {key[3]}"
        epsilon = [_spread([r[k] for r in runs if k in r]) for k in EPSILON[:2]]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {server} | {len(runs)} | {_spread(scores)} | "
            + ", ".join(f"{s:.3f}" for s in scores)
            + f" | {statistics.mean(r['rounds'] for r in runs):.0f} | "
            + " | ".join(epsilon)
            + " |"
        )
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "table"))
    parser.add_argument("folder", nargs="?", type=Path, help="table: the runs' folder")
    parser.add_argument("--preset", default="fedbuff-vs-fedasync")
    parser.add_argument("--algorithm", nargs="+", default=["fedavg-10of13"])
    parser.add_argument("--strategy", choices=(*STRATEGIES, "ours"), nargs="+", default=["fedavg"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=Path("runs/flower"))
    parser.add_argument("--dp-clip", type=float, help="dp-fixed: C (default: the arm's dp_clip)")
    parser.add_argument("--dp-noise", type=float, help="dp-fixed: z (default: the arm's dp_noise)")
    parser.add_argument("--byzantine", type=int, help="krum: f (default: the arm's, else 1)")
    parser.add_argument(
        "--attack",
        choices=("none", "sign_flip", "scale", "noise", "backdoor"),
        help="malicious devices in place of the preset's own [attack] (none: no attack)",
    )
    parser.add_argument("--share", type=float, default=0.2, help="--attack: their share")
    parser.add_argument("--smoke", action="store_true", help="a few seconds per run (SMOKE)")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.folder or args.out))
        return 0
    given = {"dp_clip": args.dp_clip, "dp_noise": args.dp_noise, "robust_byzantine": args.byzantine}
    overrides = {k: v for k, v in given.items() if v is not None}
    attack: dict[str, Any] | str | None = AS_PRESET
    tag = ""
    if args.attack == "none":
        attack, tag = None, "-none"
    elif args.attack is not None:
        attack, tag = {"kind": args.attack, "share": args.share}, f"-{args.attack}{args.share:g}"
    args.out.mkdir(parents=True, exist_ok=True)
    for algorithm in args.algorithm:
        for strategy in args.strategy:
            for seed in args.seeds:
                one = run(args.preset, algorithm, strategy, seed, args.smoke, overrides, attack)
                name = f"{args.preset}{tag}-{algorithm}-{strategy}-seed{seed}.json"
                (args.out / name).write_text(json.dumps(one, indent=1) + "\n")
                print(json.dumps(one), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
