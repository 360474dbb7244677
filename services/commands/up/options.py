"""The options of `fedasync up`, turned into settings overrides.

Each option is a shortcut for a real setting (docs/configuration.md); anything not offered here
can still be set through its FEDASYNC_ variable, which the options override.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedasync.shared.staleness import Decay

#: a default run: the long-tail fleet, time-scaled so it finishes in about a minute
DEFAULT_DEVICES = 10
DEFAULT_MAX_UPDATES = 400
DEFAULT_MAX_SECONDS = 120.0
DEFAULT_TIME_SCALE = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet and data")
    fleet.add_argument(
        "--devices", type=int, default=DEFAULT_DEVICES, help="device workers (processes)"
    )
    fleet.add_argument(
        "--profile",
        choices=["longtail", "lognormal", "pareto", "exponential", "none"],
        default="longtail",
        help="latency profile of the fleet (the write-up's long tail by default)",
    )
    fleet.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help="real seconds per profile second (0.01: a 30 s device takes 0.3 s)",
    )
    fleet.add_argument(
        "--task",
        default=None,
        help="learning task: digits, linear, synthetic, or package.module:attribute",
    )
    fleet.add_argument(
        "--task-params",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="the task's keyword arguments as a JSON object, e.g. '{\"hidden\": 64}'",
    )
    fleet.add_argument(
        "--partition", choices=["iid", "dirichlet", "shards"], default=None, help="data split"
    )
    fleet.add_argument("--seed", type=int, default=None, help="seed of the model and data split")
    budget = parser.add_argument_group("budgets (whichever is reached first ends the run)")
    budget.add_argument("--max-updates", type=int, default=DEFAULT_MAX_UPDATES)
    budget.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS)
    policy = parser.add_argument_group("policy (the initial one; the dashboard can change it)")
    policy.add_argument("--mode", choices=["fedasync", "fedbuff"], default=None)
    policy.add_argument("--decay", choices=[d.value for d in Decay], default=None)
    policy.add_argument("--alpha0", type=float, default=None)
    policy.add_argument("--gamma", type=float, default=None)
    policy.add_argument("--tau-max", type=int, default=None)
    policy.add_argument("--buffer-size", type=int, default=None, help="FedBuff's K")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--secure",
        action="store_true",
        help="every device gets a key of its own and publishes through the ingest service; "
        "the aggregator refuses unsigned updates",
    )
    run.add_argument(
        "--out", type=Path, default=None, help="run folder (default: runs/up-<date>-<time>)"
    )
    run.add_argument(
        "--no-live",
        action="store_true",
        help="print a progress line every few seconds instead of the live view",
    )


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object from the command line, or argparse's own clear error."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object is needed, e.g. '{\"hidden\": 64}'")
    return value


def overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Settings sections to override, from the options given (None: leave the setting alone)."""
    chosen: dict[str, dict[str, Any]] = {
        "task": {
            "num_devices": args.devices,
            "name": args.task,
            "params": args.task_params,
            "partition": args.partition,
            "seed": args.seed,
        },
        "worker": {"profile": args.profile, "time_scale": args.time_scale},
        "budget": {"max_updates": args.max_updates, "max_seconds": args.max_seconds},
        "policy": {
            "mode": args.mode,
            "decay": args.decay,
            "alpha0": args.alpha0,
            "gamma": args.gamma,
            "tau_max": args.tau_max,
            "buffer_size": args.buffer_size,
        },
    }
    return {
        section: {k: v for k, v in values.items() if v is not None}
        for section, values in chosen.items()
    }
