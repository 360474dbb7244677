"""The one way a service answers a Prometheus scrape."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

#: the registry a service's /metrics answers from; the HTTP runner adds its connection figures to it
REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus text format, with its content type."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
