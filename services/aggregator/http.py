"""The aggregator's small HTTP side: liveness, readiness and Prometheus metrics (and their
OpenAPI document, /openapi.json).

Ready means restored and Redis answering a PING, as every other service's /readyz: while the
aggregator retries a lost Redis it decides nothing, and a load balancer or an operator must see
that before it gives up and exits.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import livez, redis_readiness
from fedasync.services.runtime.openapi_parts import operational_document
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response


@dataclass(slots=True)
class Readiness:
    """Ready once the state is restored; `refused` says why the aggregator will not decide."""

    ready: bool = False
    refused: str | None = None


METRICS = web.AppKey("metrics", AggregatorMetrics)
READY = web.AppKey("ready", Readiness)
REDIS = web.AppKey("redis", aioredis.Redis)


def create_app(
    metrics: AggregatorMetrics, ready: Readiness, redis: aioredis.Redis, key: str | None = None
) -> web.Application:
    """The aggregator's /livez, /readyz and /metrics; `key` (one of the run's) aims the
    readiness PING at the run's node on a Redis Cluster."""
    app = web.Application(middlewares=[json_errors])
    app[METRICS] = metrics
    app[READY] = ready
    app[REDIS] = redis
    app[REGISTRY] = metrics.exposed

    async def readyz(request: web.Request) -> web.Response:
        readiness = request.app[READY]
        if readiness.refused is not None:
            body = {"status": "refused: state mismatch", "error": readiness.refused}
            return web.json_response(body, status=503)
        if not readiness.ready:
            return web.json_response({"status": "restoring"}, status=503)
        return await redis_readiness(request.app[REDIS], key=key)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return metrics_response(request.app[METRICS].exposed)

    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
        ]
    )
    documented(app, operational_document("aggregator", "decisions, commits, lag, memory"))
    return app
