"""`fedasync devices add|revoke|list`: manage device keys without restarting anything.

`add` makes an Ed25519 key by default (`--kind hmac` for a shared secret as before): Redis keeps
only its public key, and the private key is printed once and stored nowhere. `add` prints the new
key once (it is not shown again; `list` never shows keys). The aggregator and
the ingest service see a new key at the device's next update and a revocation within
`FEDASYNC_AUTH__KEY_REFRESH_S` (services/stores/device_keys.py).
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
    actions.add_parser("list", help="client ids with their status (keys are never shown)")
    devices.set_defaults(handler=_devices)


def _devices(args: argparse.Namespace) -> int:
    import asyncio

    import redis.asyncio as aioredis

    from fedasync.services.commands.redis_target import configured, talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.runtime.settings import load_settings
    from fedasync.services.stores.device_keys import add_device, list_devices, revoke_device
    from fedasync.shared.device_auth import AuthError, check_client_id
    from fedasync.shared.keys import Keys

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

    async def go() -> int:
        redis = connect(redis_settings)
        keys = Keys(redis_settings.key_prefix)
        try:
            return await talking_to(redis_settings, command, lambda: act(redis, keys))
        finally:
            await redis.aclose()

    async def act(redis: aioredis.Redis, keys: Keys) -> int:
        if args.devices_command == "add":
            key = await add_device(redis, keys, args.client_id, args.kind)
            print(key)
            print(
                f"key of {args.client_id}: shown once; give it to the device (a fedasync "
                "worker reads FEDASYNC_WORKER__KEY; your own code passes it to "
                "DeviceClient(..., key=...))",
                file=sys.stderr,
            )
            return 0
        if args.devices_command == "revoke":
            had = await revoke_device(redis, keys, args.client_id)
            if had:
                print(f"{args.client_id}: revoked")
                return 0
            # most often a typo: the device meant keeps its key, so a script must not read success
            print(
                f"fedasync devices revoke: {args.client_id!r} had no key, so no device lost "
                "one (`fedasync devices list` shows the ids); the id is listed as revoked",
                file=sys.stderr,
            )
            return 1
        print(json.dumps(await list_devices(redis, keys), indent=2))
        return 0

    return asyncio.run(go())
