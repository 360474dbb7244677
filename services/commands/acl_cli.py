"""`fedasync acl`: print the Redis ACL file of every fedasync user (services/stores/acl.py).

Without options each user carries a `${REDIS_PASSWORD_<USER>}` placeholder (docker/redis/users.acl
is this output for the default prefix); `--passwords-from-env` fills them in from those variables;
`--new-passwords` prints fresh random passwords as `.env` lines for Docker Compose. `--sentinel`
prints the `user` lines of a Sentinel's configuration file instead (docker/redis/sentinel.conf).

`--all-runs` grants every run's keys (`{*}:...`) instead of one prefix's, and adds the
supervisor's user and `runs retire`'s rights; `--cluster` adds what a Redis Cluster client sends
(CLUSTER SLOTS, COMMAND, ASKING) to every user and the `cluster-admin` user that makes the cluster
(docker/redis/users-cluster.acl is `fedasync acl --all-runs --cluster`).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys


def add_arguments(acl: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync acl`."""
    acl.add_argument("--prefix", help="key prefix (default: FEDASYNC_REDIS__KEY_PREFIX)")
    acl.add_argument(
        "--all-runs",
        action="store_true",
        help="every run's keys ({*}:...) instead of one prefix's; adds the supervisor user and "
        "`runs retire`'s rights (admin)",
    )
    acl.add_argument(
        "--cluster",
        action="store_true",
        help="for Redis Cluster nodes: each user may also send CLUSTER SLOTS, COMMAND and ASKING "
        "(redis-py's cluster client), plus the cluster-admin user (`redis-cli --cluster "
        "create`); no Sentinel user",
    )
    acl.add_argument(
        "--sentinel",
        action="store_true",
        help="the Sentinels' users (for sentinel.conf) instead of the data servers' ACL file",
    )
    source = acl.add_mutually_exclusive_group()
    source.add_argument(
        "--passwords-from-env",
        action="store_true",
        help="passwords from REDIS_PASSWORD_<USER> instead of placeholders",
    )
    source.add_argument(
        "--new-passwords",
        action="store_true",
        help="print new random passwords as REDIS_PASSWORD_<USER>=... lines (for .env): "
        "every user of every profile (Sentinels, cluster, supervisor)",
    )
    acl.set_defaults(handler=_acl)


def _acl(args: argparse.Namespace) -> int:
    from fedasync.services.runtime.settings import load_settings
    from fedasync.services.stores.acl import (
        acl_file,
        password_variables,
        passwords_from_env,
        passwords_of,
        sentinel_acl,
        sentinel_users,
    )

    prefix = args.prefix if args.prefix is not None else load_settings().redis.key_prefix
    scope = {"all_runs": args.all_runs, "cluster": args.cluster}
    try:
        if args.new_passwords:
            # every user any of the deployment's files names (the profiles' too): one .env
            # starts every profile of the compose file, whatever --all-runs/--cluster say
            every = password_variables(prefix) + password_variables(
                prefix, all_runs=True, cluster=True
            )
            for variable in dict.fromkeys(every):
                print(f"{variable}={secrets.token_hex(24)}")
            return 0
        if args.sentinel:
            among = sentinel_users()
            given = passwords_of(among, os.environ) if args.passwords_from_env else None
            print(sentinel_acl(given), end="")
            return 0
        passwords = None
        if args.passwords_from_env:
            passwords = passwords_from_env(prefix, os.environ, **scope)
        print(acl_file(prefix, passwords, **scope), end="")
    except ValueError as exc:
        print(f"fedasync: {exc}", file=sys.stderr)
        return 2
    return 0
