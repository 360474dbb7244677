"""`fedasync chaos [--profile NAME] [--seed N] [--out DIR] [--replica-lag-ms MS] [--no-acl]`, or
`fedasync chaos --compose [--seed N | --ha [--durable-replicas N]] [--out DIR] [--build]
[--keep]`; exit 1 if a check fails.

A replicated profile (`failover`) runs three times, durable mode off, on and as shipped (the
default), and ends with a table of the three, kills and pauses of the primary on rows of their
own. The cluster profile (`cluster-failover`) runs several runs on a Redis Cluster, kills -9
their primaries in turn, and ends with a table of each kill as each run saw it: the victim (its
slot's primary killed) and the bystanders."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedasync.services.commands.chaos.schedule import PROFILES, Profile
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
        "--replica-lag-ms",
        type=int,
        help="replicated profiles: how far behind its primary each replica receives the "
        "replication stream, ms (default: the profile's; 0: as fast as loopback)",
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
        "--ha",
        action="store_true",
        help="instead of the crashes: the `ha` profile under Sentinel, one loss of the Redis "
        "primary and its failover (project fedasync-failover)",
    )
    compose.add_argument(
        "--durable-replicas",
        type=int,
        default=None,
        help="with --ha: FEDASYNC_REDIS__DURABLE_REPLICAS (default: unset, as shipped: on with "
        "the Sentinels; 0: durable mode off)",
    )
    compose.add_argument(
        "--keep",
        action="store_true",
        help="leave the stack running afterwards (project fedasync-chaos)",
    )


def add_command(chaos: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync chaos`."""
    add_arguments(chaos)
    chaos.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from fedasync.services.commands.chaos.harness import (  # the services: only for a run
        run,
        run_failover,
    )
    from fedasync.services.commands.chaos.report import describe, failover_table
    from fedasync.services.commands.chaos.system import AclNeedsRedis7
    from fedasync.services.commands.redis_launch.server import RedisNotFound

    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.compose:
        if args.mode or args.replica_lag_ms is not None:
            # the stack's policy and topology are the compose file's, not the harness's
            print(
                "fedasync chaos: --mode and --replica-lag-ms are for the process profiles; a "
                "compose run takes the stack's own settings (its policy: PATCH /v1/policy on the "
                "control service)",
                file=sys.stderr,
            )
            return 2
        return _compose(args, args.out or Path("runs") / f"chaos-compose-seed{args.seed}-{stamp}")
    out = args.out or Path("runs") / f"chaos-{args.profile}-seed{args.seed}-{stamp}"
    profile = PROFILES[args.profile]
    if args.no_acl:
        profile = dataclasses.replace(profile, acl=False)
    if args.replica_lag_ms is not None:
        if args.replica_lag_ms < 0 or not profile.replicated:
            print(
                "fedasync chaos: --replica-lag-ms is ≥ 0, for a replicated profile", file=sys.stderr
            )
            return 2
        profile = dataclasses.replace(profile, replica_lag_ms=args.replica_lag_ms)
    policy = {"mode": args.mode} if args.mode else None
    if profile.cluster_runs:
        return _cluster(profile, args.seed, out, policy)
    try:
        summaries = (
            run_failover(profile, args.seed, out, policy=policy)
            if profile.replicated
            else [run(profile, args.seed, out, policy=policy)]
        )
    except (RedisNotFound, AclNeedsRedis7) as exc:
        print(f"fedasync chaos: {exc}", file=sys.stderr)
        return 2
    for summary in summaries:
        print(describe(summary))
    if profile.replicated:
        print(
            f"\nfailover, seed {args.seed}, replicas {profile.replica_lag_ms} ms behind their "
            "primary: durable mode off, on, and as shipped\n"
        )
        print(failover_table(summaries))
    return 0 if all(summary["ok"] for summary in summaries) else 1


def _cluster(profile: Profile, seed: int, out: Path, policy: dict[str, str] | None) -> int:
    """A cluster profile: its runs, each kill read per run, and the table of kills × runs."""
    from fedasync.services.commands.chaos.cluster_harness import (
        CLUSTER_VARIANTS,
        run_cluster_failover,
    )
    from fedasync.services.commands.chaos.cluster_report import cluster_failover_table, describe
    from fedasync.services.commands.chaos.system import AclNeedsRedis7
    from fedasync.services.commands.redis_launch.server import RedisNotFound
    from fedasync.services.runtime.supervisor import ChildFailed

    try:
        summaries = run_cluster_failover(
            profile, seed, out, variants=CLUSTER_VARIANTS, policy=policy
        )
    except (RedisNotFound, AclNeedsRedis7) as exc:
        print(f"fedasync chaos: {exc}", file=sys.stderr)
        return 2
    except (ChildFailed, TimeoutError) as exc:  # never trained: nothing to audit
        print(f"fedasync chaos: the system did not start training: {exc}", file=sys.stderr)
        return 1
    for summary in summaries:
        print(describe(summary))
    print(
        f"\ncluster failover, seed {seed}: {profile.cluster_runs} runs, each on a primary of "
        f"its own, {profile.workers} workers each; durable mode off, then on; a row per kill -9 "
        "and run\n"
    )
    print(cluster_failover_table(summaries))
    return 0 if all(summary["ok"] for summary in summaries) else 1


def _compose(args: argparse.Namespace, out: Path) -> int:
    from fedasync.services.commands.chaos.compose.failover import Failover, describe_failover
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
    run = (
        Failover(root, out, durable_replicas=args.durable_replicas)
        if args.ha
        else Run(root, out, args.seed)
    )
    try:
        if args.build:
            print(f"chaos --compose: building the images ({run.stack.build():.0f} s)")
        summary = run.execute(keep=args.keep)
    except ComposeError as exc:
        print(f"fedasync chaos --compose: {exc}", file=sys.stderr)
        return 1
    print(describe(summary))
    if args.ha:
        print(describe_failover(summary))
    return 0 if summary["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedasync.services.commands.chaos", description=__doc__
    )
    add_arguments(parser)
    return handle(parser.parse_args(argv))
