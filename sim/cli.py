"""`fedasync simulate` and `fedasync advise`, whose arguments services/commands/cli.py adds
when one of them is the command typed.

Each handler takes the parsed arguments and returns an exit code: 0 done, 2 bad input, and for
`simulate` 1 when an algorithm's run stalled (too many refusals, none applied: sim/stall.py).
Adding the arguments imports only the presets' names: the simulator, its pydantic config and
numpy are imported by the handler, so `--help` or a typo costs a fraction of a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedasync.sim.presets import PRESETS, SUMMARIES, preset_text

if TYPE_CHECKING:
    from fedasync.shared.fleet import RunLatency
    from fedasync.sim.advisor import Advice
    from fedasync.sim.config import SimConfig
    from fedasync.sim.result import Progress


def _input_errors() -> tuple[type[Exception], ...]:
    """What bad input a handler reports in one line (imported once a handler runs)."""
    from fedasync.learning.partition import PartitionError
    from fedasync.learning.tasks import TaskError
    from fedasync.sim.config import ConfigError
    from fedasync.sim.presets import UnknownPresetError
    from fedasync.sim.trace import TraceError

    return (ConfigError, TraceError, PartitionError, UnknownPresetError, TaskError)


def add_simulate(simulate: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync simulate` (its name and help: the command's table)."""
    _source_arguments(simulate)
    simulate.add_argument(
        "--out", type=Path, help="output folder (default runs/NAME-seedSEED, runs/NAME-seeds)"
    )
    simulate.add_argument(
        "--seeds",
        type=int,
        help="run seeds SEED, SEED+1, … (this many) and write mean ± sd across them "
        "(seeds.md, seeds.json, per_class_time.png) beside each seed's own folder",
    )
    simulate.add_argument(
        "--jobs", type=int, default=1, help="with --seeds: seeds simulated at once (processes)"
    )
    simulate.add_argument("--no-plots", action="store_true", help="summary and CSVs only")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar")
    simulate.add_argument(
        "--list-presets", action="store_true", help="list presets, one line each, and exit"
    )
    simulate.add_argument(
        "--show-config", action="store_true", help="print the preset's TOML and exit"
    )
    simulate.set_defaults(handler=_simulate)


def add_advise(advise_cmd: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync advise`."""
    _source_arguments(advise_cmd)
    advise_cmd.add_argument(
        "--trace", type=Path, help="CSV device,duration_s: use these latencies instead"
    )
    advise_cmd.add_argument("--rate", type=float, help="updates per second (default: estimated)")
    advise_cmd.add_argument("--tau-max", type=int, help="tau_max to evaluate (default: advised)")
    advise_cmd.add_argument("--backoff", type=float, default=0.25, help="back-off (0.2-0.3)")
    advise_cmd.add_argument("--quantile", type=float, default=0.95, help="the slowest devices")
    advise_cmd.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise_cmd.set_defaults(handler=_advise)


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration")
    parser.add_argument("--config", type=Path, help="TOML or YAML file (on top of --preset)")
    parser.add_argument("--seed", type=int, help="overrides the config's seed")


def _guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from fedasync.learning.task_failure import TaskCodeError, keep_details

        try:
            return run(args)
        except _input_errors() as exc:
            print(f"fedasync: {exc}", file=sys.stderr)
            return 2
        except TaskCodeError as exc:  # the task's own code: one line, its traceback in a file
            kept = keep_details(exc)
            print(f"fedasync: {exc} (its traceback: {kept})", file=sys.stderr)
            return 2

    return handler


@_guarded
def _simulate(args: argparse.Namespace) -> int:
    if args.list_presets:
        width = max(len(name) for name in PRESETS)
        for name in sorted(PRESETS):
            print(f"{name:<{width}}  {SUMMARIES[name]}")
        return 0
    from fedasync.sim.config import ConfigError, load_config

    if args.show_config:
        if args.preset is None:
            raise ConfigError("--show-config needs --preset")
        print(preset_text(args.preset), end="")
        return 0
    from fedasync.shared.per_class import describe_lagging, lagging_classes
    from fedasync.sim.output import write_all, write_data
    from fedasync.sim.runner import simulate
    from fedasync.sim.world import build_world

    config = load_config(args.config, args.preset, args.seed)
    world = build_world(config)  # the task is built first: a bad one is one line, nothing shown
    if args.seeds is not None:
        return _simulate_seeds(args, config)
    out = args.out if args.out is not None else Path("runs") / f"{config.name}-seed{config.seed}"
    with _progress(config.budget.max_seconds, enabled=not args.quiet) as progress:
        sim = simulate(config, progress=progress, world=world)
    summary = write_all(sim, out) if not args.no_plots else write_data(sim, out)
    for name, result in summary["algorithms"].items():
        reached = result["time_to_target"]["time_s"]
        when = "not reached" if reached is None else f"at {reached / 60:.1f} min"
        target = "" if config.eval.target is None else f"target {when}, "  # none set: no claim
        print(
            f"{name:>22}: final {result['final']['score']:.3f}, {target}"
            f"{result['updates']['applied']} applied, {result['updates']['dropped']} dropped, "
            f"ended by {result['ended_by']}"
        )
        lagging = describe_lagging(lagging_classes(result["final"]["per_class"]))
        if lagging:
            print(f"{'':>22}  {lagging}")
    print(f"wrote {out}/summary.json" + ("" if args.no_plots else f" and {out}/report.md"))
    return _stalled(summary)


def _simulate_seeds(args: argparse.Namespace, config: SimConfig) -> int:
    from fedasync.sim.config import ConfigError
    from fedasync.sim.multiseed import SeedRun, configs_for, run_seeds, write_seeds

    if args.seeds < 1 or args.jobs < 1:
        raise ConfigError("--seeds and --jobs must be at least 1")
    out = args.out if args.out is not None else Path("runs") / f"{config.name}-seeds"

    def done(run: SeedRun) -> None:
        if not args.quiet:
            print(f"seed {run.seed} done: {out}/seed{run.seed}", file=sys.stderr)

    runs = run_seeds(
        configs_for(config, args.seeds), out, jobs=args.jobs, plots=not args.no_plots, done=done
    )
    write_seeds(runs, config, out)
    print((out / "seeds.md").read_text(), end="")
    print(f"wrote {out}/seeds.md, {out}/seeds.json and {out}/per_class_time.png")
    return max(_stalled(run.summary, f"seed {run.seed}: ") for run in runs)


def _stalled(summary: dict[str, Any], where: str = "") -> int:
    """One line on stderr per algorithm that ended as stalled (sim/stall.py), and exit code 1
    if any did: a run that stopped learning is a failure, not a result."""
    code = 0
    for name, result in summary["algorithms"].items():
        if "stalled" in result:
            minutes = result["simulated_seconds"] / 60
            print(
                f"fedasync: {where}{name} stopped at {minutes:.1f} simulated min: "
                f"{result['stalled']}",
                file=sys.stderr,
            )
            code = 1
    return code


@contextmanager
def _progress(total_s: float, *, enabled: bool) -> Iterator[Callable[[str], Progress] | None]:
    """A rich progress bar per algorithm over simulated time on a terminal, plain lines
    elsewhere (sim/progress_lines.py); display only, never recorded."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    if not console.is_terminal:
        from fedasync.sim.progress_lines import line_progress

        yield line_progress(total_s, lambda line: print(line, file=sys.stderr, flush=True))
        return

    columns = (
        TextColumn("{task.description:>22}"),
        BarColumn(),
        TextColumn("{task.fields[sim]:>9} simulated, {task.fields[applied]:>6} applied"),
        TimeElapsedColumn(),
    )
    with Bar(*columns, console=console) as bar:

        def start(name: str) -> Progress:
            task = bar.add_task(name, total=total_s, sim="0 min", applied=0)

            def advance(sim_s: float, applied: int) -> None:  # cheap: rich redraws at 10 Hz
                bar.update(task, completed=sim_s, sim=f"{sim_s / 60:.0f} min", applied=applied)

            return advance

        yield start


@_guarded
def _advise(args: argparse.Namespace) -> int:
    from fedasync.shared.fleet import ReplayedLatency
    from fedasync.sim.advisor import Laws, advise, estimated_rate
    from fedasync.sim.config import ConfigError, load_config
    from fedasync.sim.trace import read_durations

    latencies: list[RunLatency]
    concurrency = None
    if args.trace is not None:
        latencies = [ReplayedLatency(d) for d in read_durations(args.trace).values()]
    else:
        from fedasync.sim.runner import fleet_advice
        from fedasync.sim.world import build_world

        if args.config is None and args.preset is None:
            raise ConfigError("give --trace, --preset or --config")
        world = build_world(load_config(args.config, args.preset, args.seed))
        latencies = world.new_latencies()
        concurrency = world.config.fleet.max_concurrency
        if args.rate is None:
            args.rate = fleet_advice(world).rate_per_s
    laws = Laws(latencies)
    rate = args.rate if args.rate is not None else estimated_rate(laws, concurrency)
    try:
        advice = advise(laws, rate, args.tau_max, backoff=args.backoff, quantile=args.quantile)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        print(json.dumps(advice.to_dict(), sort_keys=True, indent=2))
    else:
        print(describe(advice, len(latencies)))
    return 0


def describe(advice: Advice, devices: int) -> str:
    """The advice in words, with the arithmetic shown."""
    q = f"P{advice.quantile * 100:g}"
    low, high = advice.recommended_range
    return "\n".join(
        [
            f"fleet: {devices} devices; update rate r = {advice.rate_per_s:.3f}/s",
            f"{q} latency of a run: {advice.slow_latency_s:.1f} s",
            f"expected tau of the slowest devices = r x {q} = {advice.expected_tau_slowest:.1f}",
            f"recommended tau_max = {advice.recommended_tau_max} "
            f"(back-off {advice.backoff:.0%}; 30%..20%: {low}..{high})",
            f"at tau_max = {advice.tau_max}: runs longer than {advice.cutoff_s:.1f} s are dropped;"
            f" {len(advice.permanently_dropped)} devices ({advice.permanently_dropped_share:.1%})"
            f" are permanently dropped; {advice.dropped_update_share:.1%} of all updates dropped",
        ]
    )
