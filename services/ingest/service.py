"""Run the ingest app until stopped."""

from __future__ import annotations

from services.http_service import http_service
from services.ingest.app import create_app

run = http_service("ingest service", create_app, lambda s: (s.ingest.host, s.ingest.port))
