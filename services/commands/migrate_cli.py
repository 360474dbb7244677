"""`fedasync migrate`: convert what an earlier release left in Redis to today's format, once.

Run as the admin Redis user, with the services stopped or running (each conversion is one
transaction). Idempotent: a second run finds nothing to do and says so. Every service that
would fail on an old format refuses to start and names this command instead.
"""

from __future__ import annotations

import argparse


def add_arguments(migrate: argparse.ArgumentParser) -> None:
    """The handler of `fedasync migrate` (its help and description: the command's table)."""
    migrate.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    import asyncio

    from fedasync.services.commands.redis_target import configured, talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.runtime.settings import load_settings
    from fedasync.services.stores.policy_store import migrate_policy_log
    from fedasync.shared.keys import Keys

    redis_settings = configured(load_settings().redis, "migrate")

    async def go() -> int:
        redis = connect(redis_settings)
        keys = Keys(redis_settings.key_prefix)

        async def act() -> int:
            converted = await migrate_policy_log(redis, keys)
            if converted is None:
                print(f"{keys.policy_log}: already in the current format, nothing to do")
            else:
                print(f"{keys.policy_log}: {converted} records converted from a stream to a list")
            return 0

        try:
            return await talking_to(redis_settings, "migrate", act)
        finally:
            await redis.aclose()

    return asyncio.run(go())
