"""The one shape of every service's main(): settings, logging, run, exit code.

Exit codes: 0 stopped cleanly, 1 Redis unreachable for longer than the retries last (one log
line; a supervisor's restart may help), 2 invalid settings (one line on stderr, nothing
started) or a task whose own train or evaluate raised (one line on stderr naming the task, the
method and the user's frame; the traceback in the log: learning/task_failure.py), 3 a fatal
condition the service reports (e.g. an aggregator fenced off by a newer
one), 4 a refusal to run on data that contradicts itself (an aggregator that found Redis moved
back in time):
restarting will not help, an operator must look first (docs/operations.md). A service that
builds the task (`builds_task`) builds it here first, so a task that cannot be imported or built
is invalid settings, not a traceback from inside the running service. So is a service without a
Redis to talk to (`needs_redis`: no FEDASYNC_REDIS__URL), and one whose host and port (the
settings section `listens_on` names) cannot be listened on: a port in use is one line naming its
variable (FEDASYNC_SNAPSHOT__PORT) and exit code 2, as the settings must change (or whatever holds
the port must stop) before a restart can help.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fedasync.learning.task_failure import TaskCodeError
from fedasync.learning.tasks import TaskError
from fedasync.services.runtime.http_service import CannotListen
from fedasync.services.runtime.logs import configure
from fedasync.services.runtime.settings import (
    Problem,
    Settings,
    SettingsError,
    env_name,
    load_settings,
)

log = logging.getLogger(__name__)

#: a lost connection to Redis that outlasted every retry (not an OSError of any other kind)
REDIS_GONE = (RedisConnectionError, RedisTimeoutError, ConnectionError)

#: Redis could not be reached for longer than the retries last: a restart may well help
EXIT_REDIS_GONE = 1
EXIT_SETTINGS = 2
EXIT_FATAL = 3
EXIT_REFUSED = 4


def run_service(
    name: str | Callable[[Settings], str],
    start: Callable[[Settings], Coroutine[Any, Any, Any]],
    fatal: tuple[type[Exception], ...] = (),
    refused: tuple[type[Exception], ...] = (),
    *,
    builds_task: bool = False,
    needs_redis: bool | Callable[[Settings], bool] = True,
    listens_on: str | None = None,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> int:
    """Run a service's `start` under its settings; the exit code (module docstring).

    `needs_redis`: whether (under these settings) it talks to Redis, so that without one it stops
    before starting. `listens_on`: the settings section whose host and port it serves HTTP on,
    named when they cannot be listened on.
    """
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"{name if isinstance(name, str) else 'fedasync'}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    prefix = name if isinstance(name, str) else name(settings)
    try:
        if needs_redis(settings) if callable(needs_redis) else needs_redis:
            require_redis(settings)
        if builds_task:
            settings.task.build()
    except SettingsError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    configure(settings.log, prefix)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            result = runner.run(start(settings))
    except CannotListen as exc:
        print(f"{prefix}: {cannot_listen(exc, listens_on)}", file=sys.stderr)
        return EXIT_SETTINGS
    except TaskCodeError as exc:  # the task's train or evaluate raised: its code to fix
        log.error("the task's code failed; its traceback:\n%s", exc.details.rstrip())
        print(f"{prefix}: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    except (TaskError, SettingsError) as exc:  # found once running: the task's own code failed
        # making its data (its params to fix), or a task other than the run's
        shown = exc if isinstance(exc, SettingsError) else f"invalid settings: {exc}"
        print(f"{prefix}: {shown}", file=sys.stderr)
        return EXIT_SETTINGS
    except refused as exc:
        log.error("refused to run: %s", exc)
        return EXIT_REFUSED
    except fatal as exc:
        log.error("stopping: %s", exc)
        return EXIT_FATAL
    except REDIS_GONE as exc:  # its calls were retried until FEDASYNC_REDIS__RECONNECT_ATTEMPTS
        log.error(
            "Redis unreachable, still after %d reconnection attempts (%s); exiting with code %d "
            "for a supervisor to restart this service",
            settings.redis.reconnect_attempts,
            exc,
            EXIT_REDIS_GONE,
        )
        log.debug("where Redis was lost", exc_info=True)
        return EXIT_REDIS_GONE
    if result is not None:
        log.info("stopped: %s", result)
    return 0


def require_redis(settings: Settings) -> None:
    """A SettingsError (one line) when no Redis is named: no URL and no Sentinels."""
    if settings.redis.configured:
        return
    url, sentinels = env_name("redis", "url"), env_name("redis", "sentinels")
    message = (
        f"no Redis configured: set {url} to the Redis the services use (or {sentinels} to its "
        "Sentinels); `fedasync up` is the command that starts a private Redis with the services"
    )
    raise SettingsError(message, (Problem(("redis", "url"), None, message),))


def cannot_listen(exc: CannotListen, section: str | None) -> str:
    """The one line of a (host, port) that cannot be listened on, naming the variable to change."""
    if section is None:
        return str(exc)
    setting = env_name(section, "host" if exc.host_is_wrong else "port")
    return f"{setting}: {exc}"
