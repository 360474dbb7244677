"""The aggregator's small HTTP side: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web

from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.http_service import livez
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response

METRICS = web.AppKey("metrics", AggregatorMetrics)
READY = web.AppKey("ready", list)  # [bool]: set once the state is restored


def create_app(metrics: AggregatorMetrics, ready: list[bool]) -> web.Application:
    app = web.Application()
    app[METRICS] = metrics
    app[READY] = ready
    app[REGISTRY] = metrics.registry

    async def readyz(request: web.Request) -> web.Response:
        if not request.app[READY][0]:
            return web.json_response({"status": "restoring"}, status=503)
        return web.json_response({"status": "ready"})

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return metrics_response(request.app[METRICS].registry)

    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
        ]
    )
    return app
