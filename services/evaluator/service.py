"""Follow committed versions through the snapshot service and score each on the test set.

The evaluator long-polls the snapshot service (`newer_than=N`), which always answers with the
newest version: when evaluation is slower than commits, the versions in between are skipped and
counted, so the evaluator never falls further behind and never holds anything up. It reads
nothing from the aggregator's keys and writes only its own stream, so it cannot block the
aggregator. Scoring runs in a thread; the event loop keeps answering /readyz and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import redis.asyncio as aioredis
from aiohttp import web

from learning.task import Task
from learning.tasks import get_task
from services import evaluations
from services.evaluations import EvaluationRecord
from services.evaluator.metrics import EvaluatorMetrics
from services.http_service import http_service, livez, redis_readiness
from services.keys import Keys
from services.lifecycle import cancel_tasks
from services.prometheus import metrics_response
from services.redis_conn import TRANSIENT
from services.snapshot.app import MODEL_CONTENT_TYPE
from shared.model_format import ModelMessage, decode_model
from shared.seeds import Stream, stream
from shared.settings import Settings

log = logging.getLogger(__name__)

METRICS = web.AppKey("metrics", EvaluatorMetrics)


class Follower:
    """The loop: wait for a newer version, score it, record it."""

    def __init__(self, settings: Settings, redis: aioredis.Redis, metrics: EvaluatorMetrics):
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.redis.key_prefix)
        self.metrics = metrics
        self.task: Task = get_task(settings.task.name)
        _, self.test = self.task.dataset(stream(settings.task.seed, Stream.DATA))
        self.evaluated: int | None = None
        self.stopping = asyncio.Event()

    async def resume(self) -> None:
        """After a restart, continue after the newest version already recorded."""
        last = await evaluations.latest(self.redis, self.keys)
        if last is not None:
            self.evaluated = last.version

    async def run(self, session: aiohttp.ClientSession) -> None:
        cfg = self.settings.evaluator
        url = cfg.snapshot_url.rstrip("/") + "/v1/models/latest"
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                if self.evaluated is None:
                    await self.resume()
                model = await self._fetch(session, url, cfg.wait_s)
                if model is not None:
                    await self._evaluate(model)
                backoff = 0.1
            except (aiohttp.ClientError, TimeoutError, *TRANSIENT) as exc:
                self.metrics.failures.inc()
                log.warning("cannot follow versions (%s); retrying in %.1f s", exc, backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str, wait_s: float
    ) -> ModelMessage | None:
        than = -1 if self.evaluated is None else self.evaluated
        params = {"newer_than": str(than), "wait": str(wait_s)}
        async with session.get(url, params=params) as response:
            if response.status == 204:
                return None
            response.raise_for_status()
            if response.content_type != MODEL_CONTENT_TYPE:
                raise aiohttp.ClientPayloadError(f"unexpected content type {response.content_type}")
            return decode_model(await response.read())

    async def _evaluate(self, model: ModelMessage) -> None:
        version = model.snapshot.version
        if self.evaluated is not None and version <= self.evaluated:
            return
        skipped = 0 if self.evaluated is None else version - self.evaluated - 1
        started = time.perf_counter()
        evaluation = await asyncio.to_thread(
            self.task.evaluate, np.asarray(model.snapshot.weights), self.test
        )
        seconds = time.perf_counter() - started
        record = EvaluationRecord.of(version, model.created_at, evaluation, time.time(), seconds)
        await evaluations.append(self.redis, self.keys, record, self.settings.evaluator.keep)
        self.evaluated = version
        self.metrics.record(version, evaluation, seconds)
        if skipped > 0:
            self.metrics.skipped.inc(skipped)
        log.info(
            "version %d: score %.4f, loss %.4f (%.0f ms)",
            version,
            evaluation.score,
            evaluation.loss,
            seconds * 1000,
        )


FOLLOWER = web.AppKey("follower", Follower)


def create_app(settings: Settings, redis: aioredis.Redis) -> web.Application:
    app = web.Application()
    metrics = EvaluatorMetrics()
    follower = Follower(settings, redis, metrics)
    app[METRICS] = metrics
    app[FOLLOWER] = follower

    async def readyz(request: web.Request) -> web.Response:
        """Ready once Redis answers; `evaluated` says how far it got."""
        return await redis_readiness(redis, evaluated=follower.evaluated)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return metrics_response(metrics.registry)

    async def follow(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=settings.evaluator.wait_s + 30)
        session = aiohttp.ClientSession(timeout=timeout)
        task = asyncio.create_task(follower.run(session), name="follow-versions")
        yield
        follower.stopping.set()
        await cancel_tasks([task])
        await session.close()

    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
        ]
    )
    app.cleanup_ctx.append(follow)
    return app


run = http_service("evaluator", create_app, lambda s: (s.evaluator.host, s.evaluator.port))
