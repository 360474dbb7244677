"""The one shape of every service's main(): settings, logging, run, exit code.

Exit codes: 0 stopped cleanly, 2 invalid settings (one line on stderr, nothing started), 3 a
fatal condition the service reports (e.g. an aggregator fenced off by a newer one), 4 a refusal to
run on data that contradicts itself (an aggregator that found Redis moved back in time):
restarting will not help, an operator must look first (docs/operations.md). A service that
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

EXIT_FATAL = 3
EXIT_REFUSED = 4


def run_service(
    name: str | Callable[[Settings], str],
    start: Callable[[Settings], Coroutine[Any, Any, Any]],
    fatal: tuple[type[Exception], ...] = (),
    refused: tuple[type[Exception], ...] = (),
    *,
    builds_task: bool = False,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
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
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            result = runner.run(start(settings))
    except refused as exc:
        log.error("refused to run: %s", exc)
        return EXIT_REFUSED
    except fatal as exc:
        log.error("stopping: %s", exc)
        return EXIT_FATAL
    if result is not None:
        log.info("stopped: %s", result)
    return 0
