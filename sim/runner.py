"""Run every configured algorithm on one world, in order, and collect their results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedasync.sim import config as cfg
from fedasync.sim.advisor import Advice, Laws, advise, estimated_rate
from fedasync.sim.asynchronous import run_async
from fedasync.sim.result import DecisionHook, Progress, RunResult
from fedasync.sim.synchronous import run_sync
from fedasync.sim.world import World, build_world


@dataclass(frozen=True, slots=True, eq=False)
class Simulation:
    world: World
    #: the advisor's view of this fleet at the rate the fleet can sustain
    advice: Advice
    results: list[RunResult]


def fleet_advice(
    world: World, tau_max: int | None = None, buffer_size: int = 1, laws: Laws | None = None
) -> Advice:
    """Advice from the fleet's latency laws and the rate they sustain with everyone training.

    τ counts versions, and a version takes `buffer_size` updates (FedBuff's K; 1 in FedAsync), so
    the advice is for the version rate: the update rate divided by K. `laws`, the fleet's laws
    grouped once (`Laws(world.new_latencies())`), serves every algorithm's question.
    """
    fleet = world.config.fleet
    share = 1.0
    if isinstance(fleet.availability, cfg.IntermittentAvailability):
        on, off = fleet.availability.online_mean_s, fleet.availability.offline_mean_s
        share = on / (on + off)
    if laws is None:
        laws = Laws(world.new_latencies())  # grouped once, for every question below
    rate = estimated_rate(laws, fleet.max_concurrency, share)
    return advise(laws, rate / buffer_size, tau_max)


def simulate(
    config: cfg.SimConfig,
    *,
    progress: Callable[[str], Progress] | None = None,
    on_decision: DecisionHook | None = None,
    world: World | None = None,
    eager: bool = False,
) -> Simulation:
    """Build the world once, then run each algorithm on it; `progress(name)` gives a callback.

    `eager` trains every asynchronous update when it arrives, as the simulator did before
    issue 16, instead of only those the core will read: slower, and the same decisions, curves
    and summary (kept to prove exactly that).
    """
    world = world if world is not None else build_world(config)
    laws = Laws(world.new_latencies())  # one fleet: its laws and quantile, for every algorithm
    advice = fleet_advice(world, laws=laws)
    results = []
    for index, algorithm in enumerate(config.algorithms):
        callback = progress(cfg.label(algorithm)) if progress is not None else None
        if isinstance(algorithm, cfg.FedAvgConfig):
            result = run_sync(world, index, callback)
        else:
            own = advice
            # every mode but FedAsync takes a server step per K updates (a tier round in tiered)
            if algorithm.kind != "fedasync" and algorithm.buffer_size > 1:
                own = fleet_advice(world, buffer_size=algorithm.buffer_size, laws=laws)
            policy = algorithm.policy(advised_tau_max=own.recommended_tau_max)
            result = run_async(world, index, policy, callback, on_decision, eager=eager)
        if callback is not None:
            callback(result.end_s, result.recorder.updates_applied)
        results.append(result)
    return Simulation(world, advice, results)
