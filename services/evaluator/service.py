"""Follow committed versions through the snapshot service and score each on the test set.

The evaluator long-polls the snapshot service (`newer_than=N`), which always answers with the
newest version: when evaluation is slower than commits, the versions in between are skipped and
counted, so the evaluator never falls further behind and never holds anything up. Of the
aggregator's keys it reads only the run's task, once at start (stores/run_record.py), and it
writes only its own stream, so it cannot block the aggregator. Scoring runs in a thread; the
event loop keeps answering /readyz and /metrics.

An evaluator follows one run: the one its key prefix names. It asks the snapshot service for
that run's newest model (`/v1/runs/<run>/models/latest`), or by the legacy route for the
default run (and for a prefix that is no run id, which only the legacy routes can serve), and
labels every figure on its /metrics with the run.
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
from redis.exceptions import RedisError

from fedasync.learning.task import Task
from fedasync.learning.task_failure import TaskCodeError, guarded
from fedasync.learning.tasks import task_data
from fedasync.services.evaluator.metrics import EvaluatorMetrics
from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import (
    BACKGROUND,
    http_service,
    livez,
    redis_readiness,
)
from fedasync.services.runtime.lifecycle import Background
from fedasync.services.runtime.openapi_parts import operational_document
from fedasync.services.runtime.own_run import own_run
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.runtime.settings import Settings, SettingsError
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.services.stores.run_record import RunCheck
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import ModelMessage, decode_model
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.snapshot_protocol import MODEL_CONTENT_TYPE, VERSION_HEADER, latest_path
from fedasync.shared.wire import WireError

log = logging.getLogger(__name__)

METRICS = web.AppKey("metrics", EvaluatorMetrics)


class Follower:
    """The loop: wait for a newer version, score it, record it.

    Nothing but `stopping` ends the loop. A network or Redis error is retried with a backoff; a
    version that cannot be scored (a message that does not decode, weights that are not this
    task's model) is logged, counted and passed over, so one bad snapshot neither kills the
    evaluator nor makes it fetch the same bytes again and again.
    """

    def __init__(self, settings: Settings, redis: aioredis.Redis, metrics: EvaluatorMetrics):
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.redis.key_prefix)
        self.metrics = metrics
        task = settings.task.build()
        data = stream(settings.task.seed, Stream.DATA)
        _, self.test = task_data(settings.task.name, task, data)
        # its evaluate fails in one line naming the user's frame, which ends the evaluator
        self.task: Task = guarded(task, settings.task.name)
        #: the newest version scored and recorded
        self.evaluated: int | None = None
        #: the newest version fetched, scored or passed over: the next fetch asks for a newer one
        self.seen: int | None = None
        self.stopping = asyncio.Event()
        # the test split comes from the task: scoring another task's split would mislead
        self.run_check = RunCheck(redis, self.keys, settings.task)

    async def resume(self) -> None:
        """After a restart, continue after the newest version already recorded."""
        last = await evaluations.latest(self.redis, self.keys)
        if last is not None:
            self.evaluated = self.seen = last.version

    async def run(self, session: aiohttp.ClientSession) -> None:
        cfg = self.settings.evaluator
        url = cfg.snapshot_url.rstrip("/") + latest_path(own_run(self.settings))
        backoff = 0.1
        resumed = False
        while not self.stopping.is_set():
            try:
                if not resumed:
                    await self.resume()
                    resumed = True
                fetched = await self._fetch(session, url, cfg.wait_s)
                if fetched is None or await self._score(*fetched):
                    backoff = 0.1
                    continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.metrics.failures.labels("fetch").inc()
                log.warning("cannot follow versions (%s); retrying in %.1f s", exc, backoff)
            except (*TRANSIENT, RedisError) as exc:
                self.metrics.failures.labels("redis").inc()
                # a record whose reply was lost may be in Redis all the same: read what is
                # recorded again before asking for a version, or it is scored and recorded twice
                resumed = False
                log.warning(
                    "cannot read or record evaluations (%s); retrying in %.1f s", exc, backoff
                )
            except (SettingsError, TaskCodeError):
                # another task than the run's, or its evaluate fails: it would fail on every
                # version, so the service ends (exit code 2, one line, the traceback logged)
                raise
            except Exception:
                # a bug, not a bad model: keep the evaluator alive, loudly, at the backoff's pace
                self.metrics.failures.labels("error").inc()
                log.exception("evaluation failed; retrying in %.1f s", backoff)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), backoff)
            backoff = min(backoff * 2, 5.0)

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str, wait_s: float
    ) -> tuple[int | None, bytes] | None:
        """The snapshot service's answer to "newer than what I have seen": the version it names
        in its header, and the body (None if nothing newer came within `wait_s`)."""
        than = -1 if self.seen is None else self.seen
        params = {"newer_than": str(than), "wait": str(wait_s)}
        async with session.get(url, params=params) as response:
            if response.status == 204:
                return None
            response.raise_for_status()
            if response.content_type != MODEL_CONTENT_TYPE:
                raise aiohttp.ClientPayloadError(f"unexpected content type {response.content_type}")
            named = response.headers.get(VERSION_HEADER, "")
            version = int(named) if named.isdigit() else None
            return version, await response.read()

    async def _score(self, named: int | None, raw: bytes) -> bool:
        """Decode and score one fetched model, or pass over one that cannot be scored. False if
        it could not even be passed over (no version to move past): back off before asking again.
        """
        try:
            model = decode_model(raw)
        except WireError as exc:
            self._pass_over(named, "decode", f"model message does not decode: {exc}")
            return named is not None
        try:
            self.task.check_weights(np.asarray(model.snapshot.weights))
        except ValueError as exc:
            self._pass_over(model.snapshot.version, "weights", str(exc))
            return True
        await self._evaluate(model)
        return True

    def _pass_over(self, version: int | None, reason: str, why: str) -> None:
        self.metrics.failures.labels(reason).inc()
        log.error("version %s cannot be evaluated, passed over: %s", version, why)
        if version is not None and (self.seen is None or version > self.seen):
            self.seen = version

    async def _evaluate(self, model: ModelMessage) -> None:
        version = model.snapshot.version
        if self.seen is not None and version <= self.seen:
            return
        skipped = 0 if self.seen is None else version - self.seen - 1
        await self.run_check.ensure()
        started = time.perf_counter()
        evaluation = await asyncio.to_thread(
            self.task.evaluate, np.asarray(model.snapshot.weights), self.test
        )
        seconds = time.perf_counter() - started
        record = EvaluationRecord.of(version, model.created_at, evaluation, time.time(), seconds)
        # metrics first: whoever sees the record in Redis sees the metrics too (a record that
        # fails to be written is scored and counted again on the retry)
        self.metrics.record(version, evaluation, seconds)
        if skipped > 0:
            self.metrics.skipped.inc(skipped)
        await evaluations.append(self.redis, self.keys, record, self.settings.evaluator.keep)
        self.evaluated = self.seen = version
        log.info(
            "version %d: score %.4f, loss %.4f (%.0f ms)",
            version,
            evaluation.score,
            evaluation.loss,
            seconds * 1000,
        )


FOLLOWER = web.AppKey("follower", Follower)


def create_app(settings: Settings, redis: aioredis.Redis) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    metrics = EvaluatorMetrics(settings.redis.key_prefix)
    follower = Follower(settings, redis, metrics)
    background = Background()
    app[METRICS] = metrics
    app[REGISTRY] = metrics.exposed
    app[FOLLOWER] = follower
    app[BACKGROUND] = background

    async def readyz(request: web.Request) -> web.Response:
        """Ready once Redis answers and while the follower runs; `evaluated` says how far it got."""
        return await redis_readiness(
            redis, background, key=follower.keys.state, evaluated=follower.evaluated
        )

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return metrics_response(metrics.exposed)

    async def follow(app: web.Application) -> AsyncIterator[None]:
        await follower.run_check.ensure()
        timeout = aiohttp.ClientTimeout(total=settings.evaluator.wait_s + 30)
        session = aiohttp.ClientSession(timeout=timeout)
        background.start(follower.run(session), "follow-versions")
        yield
        follower.stopping.set()
        await background.stop()
        await session.close()

    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_endpoint),
        ]
    )
    documented(app, operational_document("evaluator", "evaluations, scores, durations"))
    app.cleanup_ctx.append(follow)
    return app


run = http_service("evaluator", create_app, lambda s: (s.evaluator.host, s.evaluator.port))
