"""Run the snapshot app until stopped."""

from __future__ import annotations

from fedasync.services.runtime.http_service import http_service
from fedasync.services.snapshot.app import create_app

run = http_service("snapshot service", create_app, lambda s: (s.snapshot.host, s.snapshot.port))
