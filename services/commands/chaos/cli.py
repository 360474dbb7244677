"""`fedasync chaos [--profile NAME] [--seed N] [--out DIR] [--no-acl]`, or `fedasync chaos
--compose [--seed N] [--out DIR] [--build] [--keep]`; exit 1 if a check fails."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedasync.services.commands.chaos.schedule import PROFILES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="fast", help="how many faults (fast: CI)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule")
    parser.add_argument(
        "--out", type=Path, help="run folder (default runs/chaos-PROFILE-seedN-TIME)"
    )
    parser.add_argument(
        "--no-acl",
        action="store_true",
        help="Redis without the ACL file, every service as the default user "
        "(by default each service logs in as its own user, as in the compose file)",
    )
    compose = parser.add_argument_group(
        "compose", "crash the containers of the Docker Compose stack instead (docs/operations.md)"
    )
    compose.add_argument(
        "--compose",
        action="store_true",
        help="bring up docker-compose.yml (of --project-dir) and kill its containers while it "
        "trains; needs docker, compose v2 and root on the engine's host",
    )
    compose.add_argument(
        "--project-dir",
        type=Path,
        default=Path("."),
        help="the repository holding docker-compose.yml (default: here)",
    )
    compose.add_argument(
        "--build", action="store_true", help="build the two images first (docker compose build)"
    )
    compose.add_argument(
        "--keep",
        action="store_true",
        help="leave the stack running afterwards (project fedasync-chaos)",
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
    if args.compose:
        return _compose(args, args.out or Path("runs") / f"chaos-compose-seed{args.seed}-{stamp}")
    out = args.out or Path("runs") / f"chaos-{args.profile}-seed{args.seed}-{stamp}"
    profile = PROFILES[args.profile]
    if args.no_acl:
        profile = dataclasses.replace(profile, acl=False)
    try:
        summary = run(profile, args.seed, out)
    except (RedisNotFound, AclNeedsRedis7) as exc:
        print(f"fedasync chaos: {exc}", file=sys.stderr)
        return 2
    print(describe(summary))
    return 0 if summary["ok"] else 1


def _compose(args: argparse.Namespace, out: Path) -> int:
    from fedasync.services.commands.chaos.compose.run import Run, describe
    from fedasync.services.commands.chaos.compose.stack import (
        COMPOSE_FILE,
        ComposeError,
        engine_problem,
    )

    root = args.project_dir.resolve()
    if not (root / COMPOSE_FILE).is_file():
        print(f"fedasync chaos --compose: no {COMPOSE_FILE} in {root}", file=sys.stderr)
        return 2
    problem = engine_problem()
    if problem is not None:
        print(f"fedasync chaos --compose: {problem}", file=sys.stderr)
        return 2
    run = Run(root, out, args.seed)
    try:
        if args.build:
            print(f"chaos --compose: building the images ({run.stack.build():.0f} s)")
        summary = run.execute(keep=args.keep)
    except ComposeError as exc:
        print(f"fedasync chaos --compose: {exc}", file=sys.stderr)
        return 1
    print(describe(summary))
    return 0 if summary["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedasync.services.commands.chaos", description=__doc__
    )
    add_arguments(parser)
    return handle(parser.parse_args(argv))
