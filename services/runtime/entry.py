"""The one shape of every service's main(): settings, logging, run, exit code.

Exit codes: 0 stopped cleanly, 2 invalid settings (one line on stderr, nothing started), 3 a
fatal condition the service reports (e.g. an aggregator fenced off by a newer one). A service that
builds the task (`builds_task`) builds it here first, so a task that cannot be imported or built
is invalid settings, not a traceback from inside the running service.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fedasync.services.runtime.logs import configure
from fedasync.services.runtime.settings import Settings, SettingsError, load_settings

log = logging.getLogger(__name__)


def run_service(
    name: str | Callable[[Settings], str],
    start: Callable[[Settings], Coroutine[Any, Any, Any]],
    fatal: tuple[type[Exception], ...] = (),
    *,
    builds_task: bool = False,
) -> int:
    try:
        settings = load_settings()
        if builds_task:
            settings.task.build()
    except SettingsError as exc:
        print(f"{name if isinstance(name, str) else 'fedasync'}: {exc}", file=sys.stderr)
        return 2
    configure(settings.log, name if isinstance(name, str) else name(settings))
    try:
        result = asyncio.run(start(settings))
    except fatal as exc:
        log.error("stopping: %s", exc)
        return 3
    if result is not None:
        log.info("stopped: %s", result)
    return 0
