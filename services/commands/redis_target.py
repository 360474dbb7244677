"""Which Redis a command talks to: the configured one, or the saved one of a `fedasync up` run.

`fedasync ledger` and `fedasync devices` need a Redis. Without one configured they say so in one
line and exit 2, never with a traceback; a Redis that cannot be reached is one line and exit 1.
After `fedasync up` a user has a run folder, not a Redis URL: `saved_run` starts that run's Redis
again from a copy of its append-only file, so the ledger can be verified from the folder alone.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import redis
from redis.exceptions import RedisError

from fedasync.services.commands.errors import CommandError
from fedasync.services.commands.redis_launch.server import RedisNotFound, RedisServer
from fedasync.services.runtime.settings import ENV_PREFIX, RedisSettings

T = TypeVar("T")

#: where `fedasync up` keeps its private Redis's data (services/commands/up/run.py)
RUN_REDIS_DIR = "redis"
#: written by `fedasync up` once every child has stopped: the run is over
RUN_SUMMARY = "summary.json"
#: seconds a saved Redis may take to replay its append-only file
REPLAY_TIMEOUT_S = 120.0


def configured(settings: RedisSettings, command: str, alternative: str = "") -> RedisSettings:
    """The configured Redis, or a `CommandError` naming the variable to set (and `alternative`,
    another way to give the command what it needs)."""
    if not settings.configured:
        raise CommandError(
            f"{command}: no Redis configured: set FEDASYNC_REDIS__URL to the Redis the services "
            f"use (or FEDASYNC_REDIS__SENTINELS to their Sentinels){alternative}"
        )
    return settings


def where(url: str | None) -> str:
    """host:port/db of a Redis URL, without user or password (it is printed)."""
    if not url:
        return "?"
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}{parts.path or ''}"


def redis_where(settings: RedisSettings) -> str:
    """Where the configured Redis is, as a line may print it (no user, no password)."""
    if settings.sentinels is not None:
        return f"the primary {settings.master_name!r} of the Sentinels {settings.sentinels}"
    if settings.cluster is not None:
        return f"the Redis Cluster of {settings.cluster}"
    return where(settings.url)


async def talking_to(
    settings: RedisSettings, command: str, action: Callable[[], Awaitable[T]], code: int = 1
) -> T:
    """Run `action`; a Redis that refuses or cannot be reached becomes one line (exit `code`)."""
    try:
        return await action()
    except RedisError as exc:  # connection refused and timeouts included
        raise CommandError(f"{command}: Redis at {redis_where(settings)}: {exc}", code) from None


@dataclass(frozen=True, slots=True)
class SavedRun:
    """A run's Redis, started again from a copy of its data."""

    redis: RedisSettings
    key_prefix: str
    finished: bool


@contextmanager
def saved_run(
    run: Path, settings: RedisSettings, prefix_given: bool, command: str
) -> Iterator[SavedRun]:
    """Start the Redis of a `fedasync up` run from a copy of its append-only file, on a free
    port of 127.0.0.1, for as long as the block runs.

    The copy is started, never the folder itself: a Redis on the run's own files would rewrite
    them, and the run may still be going (no summary.json yet), so nothing in the run folder is
    written. The key prefix is the one given (`prefix_given`), else the only one in the data.
    """
    data = run / RUN_REDIS_DIR
    if not run.is_dir():
        raise CommandError(f"{command}: --run {run}: no such folder")
    one_of_many = _run_of_many(run)
    if one_of_many is not None and not data.is_dir() and not prefix_given:
        # `fedasync up --runs N` keeps one Redis for all runs beside their folders
        data, prefix_given = run.parent / RUN_REDIS_DIR, True
        settings = settings.model_copy(update={"key_prefix": one_of_many})
    if not data.is_dir():
        raise CommandError(
            f"{command}: --run {run}: no {RUN_REDIS_DIR}/ in it: not a `fedasync up` run folder, "
            "or the run used a configured Redis (FEDASYNC_REDIS__URL): read it there, with the "
            "run's key prefix in FEDASYNC_REDIS__KEY_PREFIX"
        )
    with tempfile.TemporaryDirectory(prefix="fedasync-run-") as scratch:
        copy = Path(scratch) / RUN_REDIS_DIR
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("redis.log", "*.sock"))
        try:
            server = RedisServer(copy)
        except RedisNotFound as exc:
            raise CommandError(f"{command}: {exc}") from None
        try:
            server.start(timeout=REPLAY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            raise CommandError(
                f"{command}: --run {run}: its Redis did not start from the saved data ({exc}); "
                f"see {copy / 'redis.log'}",
                1,
            ) from None
        try:
            prefix = settings.key_prefix if prefix_given else _only_prefix(server, run, command)
            yield SavedRun(
                settings.model_copy(update={"url": server.url, "key_prefix": prefix}),
                prefix,
                finished=(run / RUN_SUMMARY).is_file(),
            )
        finally:
            server.stop()


@contextmanager
def run_or_configured(
    run: Path | None, settings: RedisSettings, command: str, alternative: str
) -> Iterator[RedisSettings]:
    """The Redis a command reads: a copy of the saved one of the run folder `run` (`saved_run`,
    saying on standard error when the run has not finished), or for None the configured one
    (`configured`, whose refusal names `alternative`, the --run way)."""
    if run is None:
        yield configured(settings, command, alternative)
        return
    prefix_given = f"{ENV_PREFIX}REDIS__KEY_PREFIX" in os.environ
    with saved_run(run, settings, prefix_given, command) as saved:
        if not saved.finished:
            print(
                f"{run} has no summary.json (still running, or cut short): reading a copy "
                "of its Redis as it is now",
                file=sys.stderr,
            )
        yield saved.redis


def _run_of_many(run: Path) -> str | None:
    """The run id of a folder `fedasync up --runs N` wrote (its summary names the run, and the
    Redis of all runs is beside it); None for any other folder."""
    import json

    try:
        summary = json.loads((run / RUN_SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    named = summary.get("run") if isinstance(summary, dict) else None
    if isinstance(named, str) and (run.parent / RUN_REDIS_DIR).is_dir():
        return named
    return None


def _only_prefix(server: RedisServer, run: Path, command: str) -> str:
    """The key prefix of the one training in this Redis (each has a genesis checkpoint)."""
    client = redis.Redis(port=server.port, socket_timeout=10.0)
    try:
        found: list[str] = sorted(
            bytes(key).decode()[1:].rsplit("}:", 1)[0]
            for key in client.scan_iter(match="{*}:genesis")
        )
    finally:
        client.close()
    if not found:
        raise CommandError(
            f"{command}: --run {run}: its Redis holds no training (no genesis checkpoint)"
        )
    if len(found) > 1:
        raise CommandError(
            f"{command}: --run {run}: its Redis holds trainings under the key prefixes "
            f"{', '.join(found)}: choose one with FEDASYNC_REDIS__KEY_PREFIX"
        )
    return found[0]
