"""Run the control app until stopped."""

from __future__ import annotations

import logging
from typing import Any

from fedasync.services.control.app import create_app
from fedasync.services.runtime.http_service import http_service
from fedasync.services.runtime.settings import Settings

log = logging.getLogger(__name__)

_serve = http_service("control service", create_app, lambda s: (s.control.host, s.control.port))


async def run(settings: Settings, **options: Any) -> None:
    """Serve until stopped (options as `fedasync.services.runtime.http_service.ServiceRun`)."""
    if settings.control.token is None:
        also = "" if settings.control.open_reads else " and every read (reads are not open)"
        log.warning("no FEDASYNC_CONTROL__TOKEN: every write%s will be refused", also)
    await _serve(settings, **options)
