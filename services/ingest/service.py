"""Run the ingest app until stopped."""

from __future__ import annotations

from fedasync.services.ingest.app import create_app
from fedasync.services.runtime.http_service import http_service

run = http_service("ingest service", create_app, lambda s: (s.ingest.host, s.ingest.port))
