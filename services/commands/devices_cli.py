"""`fedasync devices add|revoke|list`: manage device keys without restarting anything.

`add` makes an Ed25519 key by default (`--kind hmac` for a shared secret as before): Redis keeps
only its public key, and the private key is printed once and stored nowhere. `add` prints the new
key once (it is not shown again; `list` never shows keys). The aggregator and
the ingest service see a new key at the device's next update and a revocation within
`FEDASYNC_AUTH__KEY_REFRESH_S` (services/stores/device_keys.py).

A device key belongs to one run: `{run}:device-keys` is in the run's own slot, next to its
stream. `--run` names the run (the default run if not given); `add --run A --run B` issues one
distinct key per run, so a device of A is `unknown_device` in B, and even a key copied from A
to B cannot replay A's updates there (each run signs under its own domain:
shared/device_auth.update_domain).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(devices: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync devices`."""
    actions = devices.add_subparsers(dest="devices_command", required=True)
    add = actions.add_parser("add", help="create a key for a device and print it once")
    add.add_argument("client_id", help="the device's client id")
    add.add_argument(
        "--kind",
        choices=("ed25519", "hmac"),
        default="ed25519",
        help="ed25519 (default): Redis holds only the public key; hmac: a shared secret, "
        "stored in Redis as it is",
    )
    revoke = actions.add_parser("revoke", help="remove a device's key: its updates are refused")
    revoke.add_argument("client_id", help="the device's client id")
    listed = actions.add_parser("list", help="client ids with their status (keys are never shown)")
    for parser, many in ((add, True), (revoke, True), (listed, False)):
        parser.add_argument(
            "--run",
            dest="runs",
            action="append" if many else "store",
            metavar="RUN",
            help="the run (default: the default run, FEDASYNC_REDIS__KEY_PREFIX)"
            + (
                "; repeat it for several runs, a distinct key each, printed as `<run> <key>` "
                "lines (one run: the key alone)"
                if parser is add
                else "; repeat it for several runs"
                if many
                else ""
            ),
        )
    devices.set_defaults(handler=_devices)


def _devices(args: argparse.Namespace) -> int:
    import asyncio

    import redis.asyncio as aioredis

    from fedasync.services.commands.redis_target import configured, talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.runtime.settings import load_settings
    from fedasync.services.stores.device_keys import add_device, list_devices, revoke_device
    from fedasync.services.stores.runs import run_exists
    from fedasync.shared.device_auth import AuthError, check_client_id
    from fedasync.shared.keys import Keys
    from fedasync.shared.runs import RunIdError, check_run_id

    settings = load_settings()
    if args.devices_command != "list":
        try:
            check_client_id(args.client_id)
        except AuthError as exc:
            print(f"fedasync: {exc.detail}", file=sys.stderr)
            return 2
    command = f"devices {args.devices_command}"
    # device keys live in the Redis the aggregator and the ingest service read them from
    redis_settings = configured(settings.redis, command)
    default = redis_settings.key_prefix
    named = args.runs if isinstance(args.runs, list) else [] if args.runs is None else [args.runs]
    runs = list(dict.fromkeys(named)) or [default]
    for run in runs:
        if run == default:
            continue  # the deployment's own prefix, whatever its spelling
        try:
            check_run_id(run)
        except RunIdError as exc:
            print(f"fedasync {command}: --run {exc}", file=sys.stderr)
            return 2

    async def go() -> int:
        redis = connect(redis_settings)
        try:
            return await talking_to(redis_settings, command, lambda: each_run(redis))
        finally:
            await redis.aclose()

    async def each_run(redis: aioredis.Redis) -> int:
        unknown = [r for r in runs if r != default and not await run_exists(redis, r)]
        if unknown:
            print(
                f"fedasync {command}: no run {', '.join(map(repr, unknown))} in this deployment "
                "(`fedasync runs list` names them); no key was changed",
                file=sys.stderr,
            )
            return 2
        if args.devices_command == "add":
            return await add(redis)
        worst = 0
        for run in runs:
            worst = max(worst, await act(redis, Keys(run), f"{run}: " if len(runs) > 1 else ""))
        return worst

    async def add(redis: aioredis.Redis) -> int:
        issued = [
            (run, await add_device(redis, Keys(run), args.client_id, args.kind)) for run in runs
        ]
        for run, key in issued:
            print(key if len(issued) == 1 else f"{run} {key}")
        if runs == [default]:
            print(
                f"key of {args.client_id}: shown once; give it to the device (a fedasync "
                "worker reads FEDASYNC_WORKER__KEY; your own code passes it to "
                "DeviceClient(..., key=...))",
                file=sys.stderr,
            )
        else:
            print(
                f"keys of {args.client_id} for run {', '.join(runs)}: shown once, one per run; "
                "give each to the device for its run (DeviceClient(..., key=..., run=...)): "
                "another run's key is refused",
                file=sys.stderr,
            )
        return 0

    async def act(redis: aioredis.Redis, keys: Keys, label: str) -> int:
        if args.devices_command == "revoke":
            had = await revoke_device(redis, keys, args.client_id)
            if had:
                print(f"{label}{args.client_id}: revoked")
                return 0
            # most often a typo: the device meant keeps its key, so a script must not read success
            print(
                f"fedasync devices revoke: {label}{args.client_id!r} had no key, so no device lost "
                "one (`fedasync devices list` shows the ids); the id is listed as revoked",
                file=sys.stderr,
            )
            return 1
        print(json.dumps(await list_devices(redis, keys), indent=2))
        return 0

    return asyncio.run(go())
