"""The `fedasync` command: one entry point, one subcommand per job.

Every service, tool and the simulator registers a subcommand here; each subcommand builds its
settings in its own handler, never at import time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from fedasync.services.commands.parser import CommandParser
from fedasync.services.runtime.logs import hold_back_library_noise
from fedasync.shared import __version__

if TYPE_CHECKING:
    import numpy as np
    import redis.asyncio as aioredis

    from fedasync.services.commands.flags import Flag
    from fedasync.services.runtime.settings import RedisSettings, TaskSettings, WireSettings
    from fedasync.shared.keys import Keys

#: the policy fields that change α or whether an update is dropped (and the mode, for its preset)
ALPHA_FIELDS = ("mode", "alpha0", "gamma", "lam", "hinge_a", "hinge_b", "tau_max")


def _alpha_flags() -> tuple[Flag, ...]:
    from fedasync.services.commands.flags import policy_flags

    return policy_flags(ALPHA_FIELDS)


def _alpha_table(args: argparse.Namespace) -> int:
    """α for every rule at each τ, so a practitioner sees what a policy does before using it."""
    from fedasync.services.commands.flags import given
    from fedasync.shared.policy import Policy
    from fedasync.shared.staleness import Decay

    base = given(args, _alpha_flags()).load().policy.to_policy()
    policies = {d: Policy.from_dict(base.to_dict() | {"decay": d}) for d in Decay}
    tau_max = policies[Decay.CONSTANT].tau_max
    last = args.max_tau if args.max_tau is not None else tau_max + 2
    header = f"{'tau':>4}  " + "  ".join(f"{d.value:>11}" for d in Decay)
    print(f"alpha = alpha0 * s(tau) at server version t = {args.t}; tau_max = {tau_max}")
    print(header)
    for tau in range(last + 1):
        cells = []
        for policy in policies.values():
            value = "dropped" if policy.is_stale(tau) else f"{policy.alpha(tau, args.t):.4f}"
            cells.append(f"{value:>11}")
        print(f"{tau:>4}  " + "  ".join(cells))
    return 0


def _settings(args: argparse.Namespace) -> int:
    from fedasync.services.runtime.settings import load_settings, settings_reference
    from fedasync.shared.policy_text import reference_table

    if args.docs == "policy":
        print(reference_table(), end="")
        return 0
    if args.docs == "settings":
        print(settings_reference(), end="")
        return 0
    settings = load_settings()
    settings.task.build()  # the task as the aggregator would build it: importable, a Task
    print(json.dumps(_without_secrets(settings.model_dump(mode="json")), indent=2))
    return 0


#: how a secret is shown: set, and not what it is (SecretStr fields already print so)
HIDDEN = "**********"


def _without_secrets(dumped: dict[str, Any]) -> dict[str, Any]:
    """The settings as `fedasync settings` prints them, which operators paste into tickets: the
    Redis URL's password and the control token are hidden like the other secrets."""
    redis = dumped.get("redis", {})
    if redis.get("url"):
        parts = urlsplit(redis["url"])
        if parts.password is not None:
            user = f"{parts.username}:" if parts.username else ":"
            host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
            netloc = f"{user}{HIDDEN}@{host}" + (f":{parts.port}" if parts.port else "")
            redis["url"] = urlunsplit(parts._replace(netloc=netloc))
    control = dumped.get("control", {})
    if control.get("token"):
        control["token"] = HIDDEN
    return dumped


def _service(module: str) -> Callable[[argparse.Namespace], int]:
    """Run a service's own main(), which builds its settings and logging."""

    def handler(args: argparse.Namespace) -> int:
        entry = importlib.import_module(f"fedasync.services.{module}.__main__")
        return int(entry.main())

    return handler


#: `ledger verify` could not check (Redis unreachable or refusing, commits landing faster than
#: it can read them, a DP run's noise secret unreadable): not exit 1, which says the ledger did
#: not reproduce the committed model
VERIFY_NOT_CHECKED = 3


def _ledger(args: argparse.Namespace) -> int:
    """Export or verify the ledger of the configured Redis, or of a `fedasync up` run folder."""
    import asyncio

    from fedasync.services.commands.redis_target import run_or_configured
    from fedasync.services.runtime.settings import load_settings

    settings = load_settings()
    command = f"ledger {args.ledger_command}"
    alternative = (
        f", or give --run runs/up-… to {args.ledger_command} the ledger of a `fedasync up` run"
    )
    with run_or_configured(args.run, settings.redis, command, alternative) as redis_settings:
        return asyncio.run(
            _ledger_job(
                args,
                redis_settings,
                settings.wire.max_message_bytes,
                settings.aggregator.archive_dir,
                settings.wire,
                settings.task,
            )
        )


async def _zeno_source(
    redis: aioredis.Redis, keys: Keys, task: TaskSettings
) -> Callable[[np.ndarray], np.ndarray]:
    """Zeno++'s validation gradient for a replay: the run's recorded task (name, params, seed)
    with this process's FEDASYNC_TASK__VALIDATION_SAMPLES, built only if a decision needs it
    (a run without Zeno++ never builds its task here)."""
    from fedasync.services.aggregator.deciding import zeno_gradient_source
    from fedasync.services.stores.run_record import recorded_task

    recorded = await recorded_task(redis, keys)
    run_task = task if recorded is None else task.model_copy(update=recorded)
    built: list[Callable[[np.ndarray], np.ndarray]] = []

    def gradient_at(weights: np.ndarray) -> np.ndarray:
        if not built:
            built.append(zeno_gradient_source(run_task))
        return built[0](weights)

    return gradient_at


async def _ledger_job(
    args: argparse.Namespace,
    redis_settings: RedisSettings,
    max_message_bytes: int,
    archive_dir: Path | None = None,
    wire: WireSettings | None = None,
    task: TaskSettings | None = None,
) -> int:
    from fedasync.services.commands.errors import CommandError
    from fedasync.services.commands.redis_target import redis_where, talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.stores import ledger
    from fedasync.services.stores.archive import PayloadArchive
    from fedasync.services.stores.claim_check import claim_source
    from fedasync.services.stores.committed import CommitsTooFast
    from fedasync.services.stores.dp_secret import SecretUnreadable
    from fedasync.shared.keys import Keys

    redis = connect(redis_settings)
    keys = Keys(redis_settings.key_prefix)

    async def export() -> int:
        if args.out is None:
            count = await ledger.export(redis, keys, sys.stdout)
        else:
            try:
                out = args.out.open("w")
            except OSError as exc:
                raise CommandError(f"ledger export: --out {args.out}: {exc.strerror}") from None
            with out:
                count = await ledger.export(redis, keys, out)
        print(f"{count} decisions exported", file=sys.stderr)
        return 0

    async def verify() -> int:
        archive = None if archive_dir is None else PayloadArchive(archive_dir, keys.prefix)
        claims = (
            None
            if wire is None
            else claim_source(wire.claim_check_store, wire.claim_check_dir, redis, keys.prefix)
        )
        try:
            gradient_at = None if task is None else await _zeno_source(redis, keys, task)
            report = await ledger.verify(
                redis, keys, max_message_bytes, archive, claims, gradient_at
            )
        except (CommitsTooFast, SecretUnreadable) as exc:
            raise CommandError(f"ledger verify: {exc}", VERIFY_NOT_CHECKED) from None
        if report.nothing_committed:  # not a failed proof: most likely the wrong place
            raise CommandError(
                f"ledger verify: no training under the key prefix {keys.prefix!r} at "
                f"{redis_where(redis_settings)} (no genesis checkpoint): check "
                "FEDASYNC_REDIS__KEY_PREFIX and the database in FEDASYNC_REDIS__URL"
            )
        print(report.describe())
        return 0 if report.ok else 1

    try:
        if args.ledger_command == "export":
            return await talking_to(redis_settings, "ledger export", export)
        return await talking_to(redis_settings, "ledger verify", verify, VERIFY_NOT_CHECKED)
    finally:
        await redis.aclose()


def _up(args: argparse.Namespace) -> int:
    from fedasync.services.commands.up.run import run_up  # rich and matplotlib: only when asked for

    return run_up(args)


def _add_alpha(alpha: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.flags import add_flags

    alpha.add_argument("--t", type=int, default=0, help="server version, for the progress rule")
    alpha.add_argument("--max-tau", type=int, default=None, help="last tau shown")
    add_flags(alpha, _alpha_flags())
    alpha.set_defaults(handler=_alpha_table)


def _add_settings(settings: argparse.ArgumentParser) -> None:
    settings.add_argument(
        "--docs",
        nargs="?",
        const="settings",
        choices=["settings", "policy"],
        help="print the reference table of every setting (docs/configuration.md), or of every "
        "policy field",
    )
    settings.set_defaults(handler=_settings)


def _add_service(name: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(parser: argparse.ArgumentParser) -> None:
        parser.set_defaults(handler=_service(name))

    return add


def _add_ledger(ledger: argparse.ArgumentParser) -> None:
    ledger_commands = ledger.add_subparsers(dest="ledger_command", required=True)
    export = ledger_commands.add_parser("export", help="write the ledger as JSON lines")
    export.add_argument("--out", type=Path, help="file to write (default: standard output)")
    verify = ledger_commands.add_parser(
        "verify",
        help="replay the ledger through the core and check the committed model",
        description="Replay the ledger through the core and check the committed model. Exit "
        "code 0: reproduced; 1: not reproduced; 2: nothing to check where it looked (settings, "
        f"key prefix, run folder); {VERIFY_NOT_CHECKED}: could not check (Redis unreachable or "
        "refusing, commits landing faster than it can read them, or a differential-privacy run "
        "whose noise secret this Redis user may not read: run it as admin); 141: the reader of "
        "its output went away.",
    )
    for sub in (export, verify):
        sub.add_argument(
            "--run",
            type=Path,
            metavar="RUN_FOLDER",
            help="a `fedasync up` run folder (runs/up-…): start a copy of its saved Redis and "
            "read that, instead of FEDASYNC_REDIS__URL; the folder itself is not written",
        )
    ledger.set_defaults(handler=_ledger)


def _add_up(up: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.up.options import add_arguments

    add_arguments(up)
    up.set_defaults(handler=_up)


def _add_simulate(parser: argparse.ArgumentParser) -> None:
    from fedasync.sim.cli import add_simulate

    add_simulate(parser)


def _add_advise(parser: argparse.ArgumentParser) -> None:
    from fedasync.sim.cli import add_advise

    add_advise(parser)


def _add_devices(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.devices_cli import add_arguments

    add_arguments(parser)


def _add_chaos(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.chaos.cli import add_command

    add_command(parser)


def _add_acl(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.acl_cli import add_arguments

    add_arguments(parser)


def _add_runs(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.runs_cli import add_arguments

    add_arguments(parser)


def _add_export(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.export_cli import add_arguments

    add_arguments(parser)


def _add_migrate(parser: argparse.ArgumentParser) -> None:
    from fedasync.services.commands.migrate_cli import add_arguments

    add_arguments(parser)


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its name and one-line help, which `fedasync --help` lists without importing
    anything of it, and what adds its arguments and handler, run only for the command typed
    (each imports its settings, the simulator or the services: about 2 s of CPU for all)."""

    name: str
    help: str
    add: Callable[[argparse.ArgumentParser], None]
    description: str | None = None


COMMANDS = (
    Command("alpha", "show alpha for each staleness rule and tau", _add_alpha),
    Command("settings", "print the validated settings as JSON", _add_settings),
    *(
        Command(name, text, _add_service(name))
        for name, text in (
            ("aggregator", "run the aggregator (the single consumer of the updates stream)"),
            ("snapshot", "run the snapshot service (models over HTTP)"),
            ("worker", "run one device worker"),
            ("control", "run the control service (policy changes, status)"),
            ("ingest", "run the ingest service (authenticated HTTP entry of updates)"),
            ("evaluator", "run the evaluator (scores each new version on the test set)"),
        )
    ),
    Command("ledger", "export or verify the decision ledger", _add_ledger),
    Command(
        "export",
        "write a trained model version as ONNX, a torch state_dict or safetensors",
        _add_export,
        "Write a model version of a live deployment (FEDASYNC_REDIS__URL) or of a `fedasync up` "
        "run folder (--run) for serving or on-device inference: ONNX (checked with onnx.checker "
        "and against torch with onnxruntime on the task's test split), the torch state_dict, "
        "or the safetensors file the snapshot service serves. Exit code 0: written; 1: Redis "
        "unreachable, or the ONNX model did not predict what torch does (nothing written); 2: "
        "nothing to export as asked.",
    ),
    Command(
        "up",
        "run the whole system on this machine: Redis, services, a fleet; then a report",
        _add_up,
        "Start a private Redis (unless FEDASYNC_REDIS__URL is set), the aggregator, snapshot, "
        "control and evaluator services and a fleet of device workers; train to the budget "
        "with a live view; write a run folder (summary.json, ledger, curve, plots).",
    ),
    Command(
        "simulate",
        "run FedAsync, FedBuff and FedAvg on a simulated fleet",
        _add_simulate,
    ),
    Command(
        "advise",
        "recommend tau_max from a fleet's latencies and the update rate",
        _add_advise,
    ),
    Command(
        "devices",
        "add, revoke or list device keys",
        _add_devices,
    ),
    Command(
        "chaos",
        "inject faults into real services and check that no update is lost",
        _add_chaos,
    ),
    Command(
        "acl",
        "print the Redis ACL file (least-privilege users)",
        _add_acl,
    ),
    Command(
        "runs",
        "create, list, show, pause, resume or stop runs (through the control service)",
        _add_runs,
    ),
    Command(
        "migrate",
        "convert data an earlier fedasync release wrote to Redis (run once, as admin)",
        _add_migrate,
        "Convert data an earlier fedasync release wrote to Redis into today's format: the "
        "policy log (a stream before, a list now). Safe to run again.",
    ),
)


def _command_typed(argv: Sequence[str]) -> str | None:
    """The subcommand in `argv`: its first word that is not an option (the top-level parser
    has only --help and --version, which take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given the `argv` it will parse, one in which only the
    command typed has its arguments (the others are listed, which is all `--help` and a typo
    need), so that reading the arguments costs a fraction of what running the command does."""
    parser = argparse.ArgumentParser(
        prog="fedasync",
        allow_abbrev=False,
        description="Asynchronous federated learning: staleness-weighted, one update at a time.",
    )
    parser.add_argument("--version", action="version", version=f"fedasync {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    typed = None if argv is None else _command_typed(argv)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.description)
        if argv is None or command.name == typed:
            command.add(sub)
    return parser


#: the reader of standard output went away: what a shell reports for a process SIGPIPE ended
#: (128 + 13), and none of the codes a command gives a meaning (`ledger verify`'s 1: not reproduced)
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    hold_back_library_noise()  # `simulate`, `up`, `ledger verify` account privacy too
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(words).parse_args(words)
    try:
        return int(args.handler(args))
    except BrokenPipeError:  # `fedasync ledger export | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        code = _said_in_one_line(exc)
        if code is None:
            raise
        return code


def _said_in_one_line(exc: Exception) -> int | None:
    """Print an error a command reports in one line, and its exit code; None for any other.

    The settings' module is imported here, not before parsing: a handler that raised its error
    has imported it already, and `--help` or a typo needs none of it.
    """
    from fedasync.services.commands.errors import CommandError
    from fedasync.services.runtime.settings import SettingsError
    from fedasync.shared.params import ParamError

    if isinstance(exc, SettingsError | ParamError):
        print(f"fedasync: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, CommandError):  # what is missing or failed, in one line
        print(f"fedasync {exc}", file=sys.stderr)
        return exc.exit_code
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
