"""The options of `fedasync up`, and the settings of the run they make.

Each fleet, budget and policy option is a shortcut for a real setting (docs/configuration.md),
derived from that setting's field (services/commands/flags.py): a flag overrides its FEDASYNC_
variable, and anything not offered here can still be set through its variable. The one place
`up` departs from the settings' defaults is the budget (`DEMO_BUDGET`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedasync.services.commands.flags import Flag, add_flags, declared, given, policy_flags
from fedasync.services.runtime.setting_specs import SettingPath, env_name

if TYPE_CHECKING:
    from fedasync.services.runtime.settings import Settings

FLEET_FLAGS = (
    Flag("--devices", "task", "num_devices", "device workers (processes), one data share each"),
    Flag("--profile", "worker", "profile", "latency profile of the fleet's training times"),
    Flag("--time-scale", "worker", "time_scale"),
    Flag("--task", "task", "name"),
    Flag("--task-params", "task", "params", parse=json.loads, metavar="JSON"),
    Flag("--partition", "task", "partition"),
    Flag("--rare-class", "task", "rare_class"),
    Flag("--seed", "task", "seed"),
    Flag("--dpsgd-noise", "worker", "dpsgd_noise_multiplier"),
    Flag("--dpsgd-clip", "worker", "dpsgd_max_grad_norm"),
    Flag("--dpsgd-delta", "worker", "dpsgd_delta"),
)
BUDGET_FLAGS = (
    Flag("--max-updates", "budget", "max_updates"),
    Flag("--max-seconds", "budget", "max_seconds"),
)
POLICY_FLAGS = policy_flags()
FLAGS = FLEET_FLAGS + BUDGET_FLAGS + POLICY_FLAGS

#: `up` is a demo on one machine, time-scaled to end in about two minutes; the services on their
#: own budget for a real fleet (FEDASYNC_BUDGET__*). A flag or a FEDASYNC_BUDGET__ variable wins.
DEMO_BUDGET: dict[SettingPath, Any] = {
    ("budget", "max_updates"): 400,
    ("budget", "max_seconds"): 120.0,
}


def _budget_text() -> str:
    demo = DEMO_BUDGET[("budget", "max_updates")], DEMO_BUDGET[("budget", "max_seconds")]
    own = tuple(declared(("budget", n)).default for n in ("max_updates", "max_seconds"))
    return (
        f"up is a demo on this machine: it stops at {demo[0]} updates / {demo[1]:g} s unless a "
        f"flag or its {env_name('budget')}__ variable says otherwise. The services run on their "
        f"own (`fedasync settings`, docker compose) budget {own[0]} updates / {own[1]:g} s, for "
        "a real fleet."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser.add_argument_group("fleet and data"), FLEET_FLAGS)
    budget = parser.add_argument_group(
        "budgets (whichever is reached first ends the run)", _budget_text()
    )
    add_flags(budget, BUDGET_FLAGS, DEMO_BUDGET)
    policy = parser.add_argument_group(
        "policy (the initial one; the dashboard can change it)",
        "--mode fedbuff means what FEDASYNC_POLICY__MODE=fedbuff and a simulator algorithm of "
        "kind fedbuff mean: its preset values for the fields not given.",
    )
    add_flags(policy, POLICY_FLAGS)
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
        "--runs",
        type=_positive,
        default=1,
        metavar="N",
        help="train N runs at once on one Redis (seed, seed+1, ...), each with its own "
        "aggregator, evaluator and devices; one snapshot, control and ingest service for all",
    )
    run.add_argument(
        "--runs-file",
        type=Path,
        default=None,
        metavar="TOML",
        help="the runs to train, as [[run]] tables (id, task, policy, budget: "
        "examples/runs.toml); the first is the default run",
    )
    run.add_argument(
        "--no-live",
        action="store_true",
        help="print a progress line every few seconds instead of the live view",
    )


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of runs, 1 or more")
    return int(text)


def run_settings(args: argparse.Namespace) -> Settings:
    """The flags given, over the FEDASYNC_ variables, over up's demo budget, over the defaults;
    the task built once, so a task that cannot be built is one line and nothing is started.

    Raises SettingsError naming the flag and the text typed when a flag's value is not allowed.
    """
    from fedasync.services.runtime.settings import SettingsError

    chosen = given(args, FLAGS)
    settings = chosen.load()
    demo = {
        path: value
        for path, value in DEMO_BUDGET.items()
        if path[1] not in getattr(settings, path[0]).model_fields_set
    }
    if demo:
        settings = chosen.load(demo)
    try:
        settings.task.build()
    except SettingsError as exc:
        raise chosen.named(exc) from None
    return settings
