"""Our FedBuff against Meta's FLSim 0.1.0 FedBuff: same fleet, data and clients; only the server.

Both sides run in our simulator (sim/asynchronous.py): the same fleet of devices with the same
latencies, the same data shares, the same local training from the same snapshots, in the same
order. `ours` decides every update with `AggregationState.apply`; `flsim` hands each update to
FLSim's own server code instead: its `FedAvgWithLRFedBuffAggregator` (or the Adam one), its
`AsyncWeight` with `PolynomialStalenessWeight`, its sequence-number staleness and its reducer, as
its `AsyncTrainer.train_and_update_global_model` does. So a difference in accuracy is a difference
in the server algorithm and nothing else.

FLSim's settings that make it the paper's FedBuff (Nguyen et al. 2022), as ours is:
- the reducer sums the K weighted deltas (WEIGHTED_SUM); the paper and our core average them, so
  FLSim's lr is η/K for SGD and momentum (Adam is scale-free but for ε: same η);
- its staleness weight is normalised to 1 at `avg_staleness`, 1 by default (a factor √2 on
  every weight); 0 here, so the weight is exactly 1/√(1 + τ);
- Adam's weight decay (1e-5 by default) is 0, as in our core;
- `max_staleness` = our τ_max; both count server steps.

FLSim 0.1.0 supports Python up to 3.10 (on 3.11 its config dataclasses have instance defaults,
which `dataclasses` refuses); `flsim` restores 3.10's rule for classes it defines before importing
it (`_allow_instance_defaults`), and changes nothing else. It runs in its own virtualenv, never the
project's:

    python3 -m venv /tmp/flsim-venv
    /tmp/flsim-venv/bin/pip install torch==2.13.0
    /tmp/flsim-venv/bin/pip install flsim==0.1.0 --no-deps
    /tmp/flsim-venv/bin/pip install hydra-core omegaconf opacus tqdm pandas tensorboard \\
        scikit-learn -e .

Then (docs/experiments.md, section 6):

    .venv/bin/python bench/fedbuff_flsim.py ours --setup issue --out runs/fedbuff-flsim
    /tmp/flsim-venv/bin/python bench/fedbuff_flsim.py flsim --setup issue --out runs/fedbuff-flsim
    .venv/bin/python bench/fedbuff_flsim.py table runs/fedbuff-flsim

`ours --label before`, run with the code of an earlier commit first on PYTHONPATH, gives the
"before" rows. Each run writes one JSON file; `table` prints mean ± sd over seeds per row.

`alone` is FLSim on its own instead: its `AsyncTrainer` with its own event generator (Poisson
starts, durations per example), not our fleet, on the same data split, initial model and server
(`run_flsim_alone`), to compare what each simulator gives by itself:

    /tmp/flsim-venv/bin/python bench/fedbuff_flsim.py alone --concurrency 100 10

`--smoke` shrinks any side to seconds (`SMOKE`): tests/test_benches.py runs `ours --smoke` in CI,
and `flsim` and `alone` where FLSIM_PYTHON names FLSim's virtualenv.
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

#: issue: the setup of issue 17 on the presets' fleet, all 100 devices training at once;
#: issue-c10: the same with at most 10 training at once (τ about a tenth); preset: the
#: fedbuff-vs-fedasync preset's FedBuff (Dirichlet(0.5) labels, 10,000 updates, τ_max "auto")
SETUPS = ("issue", "issue-c10", "preset")
OPTIMIZERS = ("sgd", "momentum", "adam")
K = 10

#: The setup of issue 17: digits, 100 IID clients, MLP 64→32→10, 2 local epochs (batches of 8,
#: lr 0.1), FedBuff K = 10 with 1/√(1 + τ), 3,000 local trainings, on the presets' long-tail fleet.
#: τ_max 1000 (the largest allowed) drops nothing, as FLSim's default max_staleness = ∞.
ISSUE_SETUP: dict[str, Any] = {
    "name": "fedbuff-flsim",
    "task": {"name": "digits", "params": {"hidden": 32}},
    "training": {"epochs": 2, "lr": 0.1, "batch_size": 8},
    "data": {"partition": "iid"},
    "fleet": {"devices": 100, "latency": {"kind": "longtail", "jitter": 0.2}},
    "budget": {"max_updates": 3000, "max_seconds": 86400},
    "eval": {"interval_s": 3600},
    "algorithms": [{"kind": "fedbuff", "name": "fedbuff-k10", "buffer_size": K, "tau_max": 1000}],
}

#: each arm's server: our policy fields, and FLSim's aggregator and lr for the same step. η and β
#: of momentum and Adam were picked on seed 0 of `issue` among (η, β) = (0.1, 0.9), (0.3, 0.7),
#: (0.5, 0.5), (1, 0.3) and η = 0.03, 0.01, 0.003, 0.001 (Adam; FLSim's default lr is 0.001)
ARMS: dict[str, dict[str, Any]] = {
    "sgd": {"ours": {"server_lr": 1.0}, "flsim_lr": 1.0 / K},
    "momentum": {
        "ours": {"server_optimizer": "momentum", "server_lr": 0.5, "server_momentum": 0.5},
        "flsim_lr": 0.5 / K,
        "flsim_momentum": 0.5,
    },
    "adam": {"ours": {"server_optimizer": "adam", "server_lr": 0.001}, "flsim_lr": 0.001},
}


#: --smoke: the setup shrunk to a few seconds (CI runs every bench this way, tests/test_benches.py):
#: ten devices, two server steps, a smaller MLP, one epoch; it checks that the bench runs, not
#: what it finds
SMOKE: dict[str, Any] = {
    "task": {"name": "digits", "params": {"hidden": 8}},
    "training": {"epochs": 1, "batch_size": 32},
    "fleet": {"devices": 10},
    "budget": {"max_updates": 2 * K},
}


def config_for(setup: str, optimizer: str, seed: int, *, smoke: bool = False) -> Any:
    """The simulator config of one run: FedBuff only, with the arm's server."""
    from fedasync.sim.config import build, merge
    from fedasync.sim.presets import preset_data

    if setup.startswith("issue"):
        data = json.loads(json.dumps(ISSUE_SETUP))
        if setup == "issue-c10":
            data["fleet"]["max_concurrency"] = 10
    else:
        data = preset_data("fedbuff-vs-fedasync")
        data["algorithms"] = [a for a in data["algorithms"] if a["kind"] == "fedbuff"]
    data["algorithms"][0].update(ARMS[optimizer]["ours"])
    data["seed"] = seed
    return build(merge(data, SMOKE) if smoke else data)


def describe(recorder: Any, weights_score: float, result: Any, seconds: float) -> dict[str, Any]:
    taus = [d.tau for d in recorder.decisions if d.outcome == "applied" and d.tau is not None]
    return {
        "final_accuracy": weights_score,
        "applied": recorder.updates_applied,
        "dropped": sum(d.outcome == "dropped" for d in recorder.decisions),
        "versions": result.version,
        "median_tau": float(np.median(taus)) if taus else None,
        "p95_tau": float(np.percentile(taus, 95)) if taus else None,
        "tau_max": result.settings.get("tau_max"),
        "wall_s": round(seconds, 1),
    }


def run_ours(setup: str, optimizer: str, seed: int, smoke: bool = False) -> dict[str, Any]:
    from fedasync.sim.runner import simulate

    config = config_for(setup, optimizer, seed, smoke=smoke)
    started = time.perf_counter()
    simulation = simulate(config)
    result = simulation.results[0]
    score = result.recorder.evals[-1].score
    return describe(result.recorder, score, result, time.perf_counter() - started)


# ---------------------------------------------------------------------------------- FLSim side
def _allow_instance_defaults() -> None:
    """Python 3.11 refuses a dataclass field whose default is an unhashable instance (another
    dataclass), which FLSim's configs use; 3.10 and earlier took the instance as a shared default.
    Give classes made by `dataclass` from here on object's hash, which 3.11's check accepts."""
    import dataclasses

    original = dataclasses.dataclass

    def hashable(cls: Any = None, /, **options: Any) -> Any:
        def wrap(klass: type) -> Any:
            made: Any = original(**options)(klass)
            if made.__hash__ is None:
                made.__hash__ = object.__hash__
            return made

        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = hashable


class FlsimServer:
    """FLSim's FedBuff server behind the interface our simulator drives (`apply`, `snapshot`)."""

    def __init__(
        self,
        weights: np.ndarray,
        layout: Any,
        optimizer: str,
        max_staleness: int,
        avg_staleness: int = 0,
    ) -> None:
        import torch
        from flsim.interfaces.model import IFLModel
        from flsim.optimizers.async_aggregators import (
            FedAdamFedBuffAggregatorConfig,
            FedAvgWithLRFedBuffAggregatorConfig,
        )
        from flsim.utils.async_trainer.async_example_weights import EqualExampleWeightConfig
        from flsim.utils.async_trainer.async_staleness_weights import (
            PolynomialStalenessWeightConfig,
        )
        from flsim.utils.async_trainer.async_weights import AsyncWeightConfig
        from hydra.utils import instantiate

        from fedasync.shared.aggregation import ModelSnapshot
        from fedasync.shared.privacy.spent import PrivacySpent

        class Flat(torch.nn.Module):
            def __init__(self, values: np.ndarray) -> None:
                super().__init__()
                self.w = torch.nn.Parameter(torch.from_numpy(values.astype(np.float32).copy()))

        class Model(IFLModel):  # type: ignore[misc]  # FLSim's model interface (untyped)
            def __init__(self, values: np.ndarray) -> None:
                self.module = Flat(values)

            def fl_get_module(self) -> torch.nn.Module:
                return self.module

            def fl_forward(self, batch: Any) -> Any:
                raise NotImplementedError

            def fl_create_training_batch(self, **kwargs: Any) -> Any:
                raise NotImplementedError

            def fl_cuda(self) -> None:
                pass

            def get_eval_metrics(self, batch: Any) -> Any:
                raise NotImplementedError

            def get_num_examples(self, batch: Any) -> int:
                raise NotImplementedError

        self._torch, self._model_of, self._snapshot_of = torch, Model, ModelSnapshot
        self.layout = layout
        self.max_staleness = max_staleness
        lr = ARMS[optimizer]["flsim_lr"]
        server: Any
        if optimizer == "adam":
            server = FedAdamFedBuffAggregatorConfig(
                lr=lr, buffer_size=K, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8
            )
        else:
            momentum = ARMS[optimizer].get("flsim_momentum", 0.0)
            server = FedAvgWithLRFedBuffAggregatorConfig(lr=lr, buffer_size=K, momentum=momentum)
        self.global_model = Model(weights)
        self.aggregator = instantiate(server, global_model=self.global_model)
        self.weight = instantiate(
            AsyncWeightConfig(
                staleness_weight=PolynomialStalenessWeightConfig(
                    exponent=0.5, avg_staleness=avg_staleness
                ),
                example_weight=EqualExampleWeightConfig(),
            )
        )
        self.models: dict[int, np.ndarray] = {}
        self.counters: dict[str, int] = {"applied": 0, "dropped": 0, "server_steps": 0}
        self.lr = lr
        #: as the core's: FLSim never closes training itself (the core does at a privacy
        #: budget), and spends no privacy (no DP arm runs through FLSim)
        self.closed: str | None = None
        self.privacy = PrivacySpent()

    @property
    def version(self) -> int:
        return int(self.aggregator.global_seqnum)

    def weights_view(self) -> np.ndarray:
        """The model of the current version, read-only, as `AggregationState.weights_view`:
        the simulator hands it to every device that starts now (its base model), so it is
        kept per version for `apply` to form the delta against."""
        version = self.version
        if version not in self.models:
            values: np.ndarray = self.global_model.module.w.detach().numpy().copy()
            values.flags.writeable = False
            self.models[version] = values
        return self.models[version]

    def snapshot(self) -> Any:
        return self._snapshot_of(self.version, self.weights_view().copy(), self.layout)

    def zeno_prepare(self, policy: Any, gradient_at: Any) -> None:
        """As `AggregationState.zeno_prepare`: FLSim has no Zeno++, so nothing is ever due."""

    def drops_unread(self, base_version: int, policy: Any) -> bool:
        """As `AggregationState.drops_unread`: True when `apply` will drop the update for
        staleness without reading its weights (so the simulator need not train it)."""
        return bool(self.aggregator.model_staleness(model_seqnum=base_version) > self.max_staleness)

    def decide_unread(
        self, update_id: str, client_id: str, base_version: int, num_samples: int, policy: Any
    ) -> None:
        """As `AggregationState.decide_unread` leaving the update to `apply`: FLSim drops a
        stale update there, from the same base model the simulator submits in its place."""

    def apply(self, update: Any, policy: Any) -> Any:
        """One client's result through FLSim, as AsyncTrainer.train_and_update_global_model."""
        from fedasync.shared.decision import Decision, DropReason, Outcome

        staleness = self.aggregator.model_staleness(model_seqnum=update.base_version)
        common = {
            "update_id": update.update_id,
            "client_id": update.client_id,
            "base_version": update.base_version,
            "policy_version": 0,
            "tau": staleness,
        }
        if staleness > self.max_staleness:
            self.counters["dropped"] += 1
            return Decision(
                Outcome.DROPPED, version=self.version, reason=DropReason.STALE, **common
            )
        weight = self.weight.weight(num_examples=update.num_samples, staleness=staleness)
        before = self.models[update.base_version]  # kept when a device started from it
        delta = self._model_of(before - update.weights)  # FLSim's delta: before − after
        final = self._model_of(update.weights)
        self.aggregator.zero_grad()
        stepped = bool(self.aggregator.on_client_training_end(delta, final, weight))
        self.counters["applied"] += 1
        self.counters["server_steps"] += stepped
        return Decision(
            Outcome.APPLIED,
            version=self.version,
            alpha=self.lr * weight,
            server_step=stepped,
            **common,
        )


def run_flsim(
    setup: str, optimizer: str, seed: int, avg_staleness: int = 0, smoke: bool = False
) -> dict[str, Any]:
    _allow_instance_defaults()
    from fedasync.sim.asynchronous import AsyncRun
    from fedasync.sim.runner import fleet_advice
    from fedasync.sim.world import build_world

    config = config_for(setup, optimizer, seed, smoke=smoke)
    world = build_world(config)
    algorithm = config.algorithms[0]
    advised = fleet_advice(world, buffer_size=algorithm.buffer_size).recommended_tau_max
    policy = algorithm.policy(advised_tau_max=advised)
    started = time.perf_counter()
    run = AsyncRun("flsim-fedbuff", policy, world)
    run.state = FlsimServer(  # type: ignore[assignment]  # the simulator's server, FLSim inside
        world.init_weights.copy(), world.task.layout, optimizer, policy.tau_max, avg_staleness
    )
    result = run.run()
    score = result.recorder.evals[-1].score
    return describe(result.recorder, score, result, time.perf_counter() - started)


# ------------------------------------------------------------------- FLSim on its own (alone)
#: FLSim's own simulator, its `AsyncTrainer`: devices start training at Poisson times
#: (`training_rate` per unit of time) and train for a duration drawn per example
#: (`PerExampleGaussianDuration`: mean per example × examples, sd); so about
#: rate × mean duration devices train at once. `alone` runs it with these values of that
#: concurrency, on the same data split, initial model, local training and server as above.
CONCURRENCY = (10, 100)


def run_flsim_alone(seed: int, concurrency: int, smoke: bool = False) -> dict[str, Any]:
    """FLSim's AsyncTrainer on its own: its event generator and arrivals, not our fleet.

    Same digits split over 100 IID clients, the same initial weights, FLSim's local SGD at the
    same lr, batch size and epochs, FedBuff K = 10 with 1/√(1 + τ), 3,000 trainings (30 of its
    epochs over the 100 users). Evaluated on the same 359 test images after every 100
    trainings; both the last and the best evaluation are reported (its trainer returns the best).
    """
    _allow_instance_defaults()
    import torch
    from flsim.clients.base_client import ClientConfig
    from flsim.common.timeout_simulator import NeverTimeOutSimulatorConfig
    from flsim.data.data_provider import FLDataProviderFromList
    from flsim.interfaces.model import IFLModel
    from flsim.metrics_reporter.tensorboard_metrics_reporter import FLMetricsReporter
    from flsim.optimizers.async_aggregators import FedAvgWithLRFedBuffAggregatorConfig
    from flsim.optimizers.local_optimizers import LocalOptimizerSGDConfig
    from flsim.trainers.async_trainer import AsyncTrainer, AsyncTrainerConfig
    from flsim.utils.async_trainer.async_example_weights import EqualExampleWeightConfig
    from flsim.utils.async_trainer.async_staleness_weights import (
        PolynomialStalenessWeightConfig,
    )
    from flsim.utils.async_trainer.async_user_selector import AsyncUserSelectorType
    from flsim.utils.async_trainer.async_weights import AsyncWeightConfig
    from flsim.utils.async_trainer.training_event_generator import (
        AsyncTrainingEventGeneratorConfig,
        PoissonAsyncTrainingStartTimeDistrConfig,
    )
    from flsim.utils.simple_batch_metrics import FLBatchMetrics
    from flsim.utils.timing.training_duration_distribution import (
        PerExampleGaussianDurationDistributionConfig,
    )
    from omegaconf import OmegaConf

    from fedasync.learning.digits_net import MLP
    from fedasync.learning.torch_weights import load_vector
    from fedasync.sim.world import build_world

    config = config_for("issue", "sgd", seed, smoke=smoke)
    world = build_world(config)
    random.seed(seed)  # FLSim draws start times, durations and users from the global streams
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # as our simulator's local training runs (learning/torch_task.py)
    params = world.training
    hidden = config.task.params.get("hidden", 32)
    net = MLP(world.train.X.shape[1], hidden, world.task.num_classes)
    load_vector(net, world.init_weights, buffers=False)

    def batches(X: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
        size = params.batch_size
        return [
            {
                "features": torch.from_numpy(X[i : i + size]),
                "labels": torch.from_numpy(y[i : i + size]),
            }
            for i in range(0, len(y), size)
        ]

    class Model(IFLModel):  # type: ignore[misc]  # FLSim's model interface (untyped)
        def __init__(self, module: torch.nn.Module) -> None:
            self.module = module

        def fl_forward(self, batch: Any) -> Any:
            output = self.module(batch["features"])
            labels = batch["labels"].long()
            loss = torch.nn.functional.cross_entropy(output, labels)
            return FLBatchMetrics(
                loss=loss,
                num_examples=len(labels),
                predictions=output.detach(),
                targets=labels,
                model_inputs=[],
            )

        def fl_create_training_batch(self, **kwargs: Any) -> Any:
            return kwargs["batch"]

        def fl_get_module(self) -> torch.nn.Module:
            return self.module

        def fl_cuda(self) -> None:
            pass

        def get_eval_metrics(self, batch: Any) -> Any:
            with torch.no_grad():
                return self.fl_forward(batch)

        def get_num_examples(self, batch: Any) -> int:
            return len(batch["labels"])

    scores: list[float] = []

    class Reporter(FLMetricsReporter):  # type: ignore[misc]
        def compute_scores(self) -> dict[str, Any]:
            correct = sum(
                int((p.argmax(1) == t).sum())
                for p, t in zip(self.predictions_list, self.targets_list, strict=True)
            )
            total = sum(len(t) for t in self.targets_list)
            return {"accuracy": correct / total}

        def create_eval_metrics(self, scores_: dict[str, Any], total_loss: float, **kw: Any) -> Any:
            return scores_

        def compare_metrics(self, eval_metrics: Any, best_metrics: Any) -> bool:
            scores.append(eval_metrics["accuracy"])
            return best_metrics is None or eval_metrics["accuracy"] > best_metrics["accuracy"]

    users = [
        batches(world.device_data[i].X, world.device_data[i].y) for i in range(world.num_devices)
    ]
    test = batches(world.test.X, world.test.y)
    model = Model(net)
    provider = FLDataProviderFromList(users, [test], [test], model)
    examples = statistics.mean(len(world.device_data[i]) for i in range(world.num_devices))
    mean_per_example = concurrency / examples  # rate 1 per unit: about `concurrency` at once
    epochs = config.budget.max_updates // world.num_devices
    trainer = AsyncTrainer(
        model=model,
        cuda_enabled=False,
        **OmegaConf.structured(
            AsyncTrainerConfig(
                aggregator=FedAvgWithLRFedBuffAggregatorConfig(lr=1.0 / K, buffer_size=K),
                client=ClientConfig(
                    epochs=params.epochs, optimizer=LocalOptimizerSGDConfig(lr=params.lr)
                ),
                epochs=epochs,
                training_event_generator=AsyncTrainingEventGeneratorConfig(
                    training_start_time_distribution=PoissonAsyncTrainingStartTimeDistrConfig(
                        training_rate=1.0
                    ),
                    duration_distribution_generator=PerExampleGaussianDurationDistributionConfig(
                        training_duration_mean=mean_per_example,
                        training_duration_sd=mean_per_example / 4,
                    ),
                ),
                async_user_selector_type=AsyncUserSelectorType.RANDOM,
                async_weight=AsyncWeightConfig(
                    staleness_weight=PolynomialStalenessWeightConfig(exponent=0.5, avg_staleness=0),
                    example_weight=EqualExampleWeightConfig(),
                ),
                timeout_simulator=NeverTimeOutSimulatorConfig(),
                do_eval=True,
                eval_epoch_frequency=1.0,
            )
        ),
    )
    started = time.perf_counter()
    trainer.train(provider, Reporter([]), num_total_users=world.num_devices)
    return {
        "final_accuracy": scores[-1],
        "best_accuracy": max(scores),
        "applied": epochs * world.num_devices,
        "dropped": 0,
        "versions": int(trainer.aggregator.global_seqnum),
        "median_tau": None,
        "p95_tau": None,
        "tau_max": None,
        "concurrency": concurrency,
        "wall_s": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------------------- table
def table(folder: Path) -> str:
    rows: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        run = json.loads(path.read_text())
        key = (run["setup"], run["optimizer"], run["side"], run["label"])
        rows.setdefault(key, []).append(run)
    lines = [
        "| setup | server | implementation | seeds | final accuracy (mean ± sd) | per seed "
        "| median τ | p95 τ | τ_max | versions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"before": 0, "after": 1, "flsim": 2, "flsim-avg1": 3, "alone-c10": 5, "alone-c100": 6}
    for key in sorted(
        rows, key=lambda k: (SETUPS.index(k[0]), OPTIMIZERS.index(k[1]), order.get(k[3], 4))
    ):
        runs = sorted(rows[key], key=lambda r: r["seed"])
        scores = [r["final_accuracy"] for r in runs]
        sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
        name = f"ours, {key[3]}"
        if key[2] == "flsim":
            name = "FLSim 0.1.0" + (" (its default weight √2/√(1+τ))" if "avg" in key[3] else "")
        if key[2] == "alone":
            best = statistics.mean(r["best_accuracy"] for r in runs)
            name = (
                f"FLSim 0.1.0 alone: its AsyncTrainer, Poisson starts, ~{runs[0]['concurrency']} "
                f"at once (best evaluation {best:.3f})"
            )
        lines.append(
            f"| {key[0]} | {key[1]} | {name} | {len(runs)} | "
            f"{statistics.mean(scores):.3f} ± {sd:.3f} | "
            + ", ".join(f"{s:.3f}" for s in scores)
            + f" | {_mean(runs, 'median_tau')} | {_mean(runs, 'p95_tau')} | "
            f"{runs[0]['tau_max']} | {_mean(runs, 'versions')} |"
        )
    return "\n".join(lines)


def _mean(runs: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    return f"{statistics.mean(values):.0f}" if values else "–"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=("ours", "flsim", "alone", "table"))
    parser.add_argument("folder_or_none", nargs="?", type=Path, help="table: the runs' folder")
    parser.add_argument("--setup", choices=SETUPS, default="issue")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, nargs="+", default=["sgd"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--label", default="after", help="ours: 'before' or 'after' the change")
    parser.add_argument("--out", type=Path, default=Path("runs/fedbuff-flsim"))
    parser.add_argument(
        "--avg-staleness",
        type=int,
        default=0,
        help="flsim: normalise its staleness weight to 1 at this τ (FLSim's default is 1: √2·w)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=list(CONCURRENCY),
        help="alone: devices FLSim's own simulator keeps training at once (rate × duration)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds per run: see SMOKE (CI's check)"
    )
    args = parser.parse_args(argv)
    if args.side == "table":
        print(table(args.folder_or_none or args.out))
        return 0
    label = args.label

    def runner(setup: str, optimizer: str, seed: int) -> dict[str, Any]:
        return run_ours(setup, optimizer, seed, args.smoke)

    if args.side == "flsim":
        label = "flsim" if not args.avg_staleness else f"flsim-avg{args.avg_staleness}"

        def runner(setup: str, optimizer: str, seed: int) -> dict[str, Any]:
            return run_flsim(setup, optimizer, seed, args.avg_staleness, args.smoke)

    args.out.mkdir(parents=True, exist_ok=True)
    if args.side == "alone":
        for concurrency in args.concurrency:
            for seed in args.seeds:
                run = run_flsim_alone(seed, concurrency, args.smoke)
                run |= {"setup": "issue", "optimizer": "sgd", "side": "alone", "seed": seed}
                run |= {"label": f"alone-c{concurrency}"}
                path = args.out / f"issue-sgd-alone-c{concurrency}-seed{seed}.json"
                path.write_text(json.dumps(run, indent=1) + "\n")
                print(json.dumps(run), flush=True)
        return 0
    for optimizer in args.optimizer:
        for seed in args.seeds:
            run = runner(args.setup, optimizer, seed)
            run |= {"setup": args.setup, "optimizer": optimizer, "side": args.side}
            run |= {"label": label, "seed": seed}
            path = args.out / f"{args.setup}-{optimizer}-{label}-seed{seed}.json"
            path.write_text(json.dumps(run, indent=1) + "\n")
            print(json.dumps(run), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
