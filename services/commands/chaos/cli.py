"""`fedasync chaos [--profile NAME] [--seed N] [--out DIR] [--no-acl]`; exit 1 if a check fails."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedasync.services.commands.chaos.schedule import PROFILES
from fedasync.shared.policy import Mode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="fast", help="how many faults (fast: CI)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule")
    parser.add_argument(
        "--out", type=Path, help="run folder (default runs/chaos-PROFILE-seedN-TIME)"
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        help="the aggregator's policy mode (default: the settings' default, fedasync); the "
        "mode's preset gives the fields it leaves unset",
    )
    parser.add_argument(
        "--no-acl",
        action="store_true",
        help="Redis without the ACL file, every service as the default user "
        "(by default each service logs in as its own user, as in the compose file)",
    )


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `chaos` subcommand to the `fedasync` parser."""
    chaos = commands.add_parser(
        "chaos", help="inject faults into real services and check that no update is lost"
    )
    add_arguments(chaos)
    chaos.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from fedasync.services.commands.chaos.harness import (
        run,  # imports the services only when a run is asked for
    )
    from fedasync.services.commands.chaos.report import describe
    from fedasync.services.commands.chaos.system import AclNeedsRedis7
    from fedasync.services.runtime.redis_server import RedisNotFound

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"chaos-{args.profile}-seed{args.seed}-{stamp}"
    profile = PROFILES[args.profile]
    if args.no_acl:
        profile = dataclasses.replace(profile, acl=False)
    try:
        summary = run(profile, args.seed, out, policy={"mode": args.mode} if args.mode else None)
    except (RedisNotFound, AclNeedsRedis7) as exc:
        print(f"fedasync chaos: {exc}", file=sys.stderr)
        return 2
    print(describe(summary))
    return 0 if summary["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedasync.services.commands.chaos", description=__doc__
    )
    add_arguments(parser)
    return handle(parser.parse_args(argv))
