"""The device worker: fetch the model, train on a copy, publish the update, repeat.

A conditional GET makes an unchanged model cost a 304; training runs in a thread so the loop
stays responsive to SIGTERM; a slow device is imitated by waiting out its latency; a publish that
fails on the connection is retried with the same bytes (the same update id), which the
aggregator recognises as one update. The worker never trims the stream (no MAXLEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from services.keys import Keys
from services.lifecycle import stop_on_signals
from services.redis_conn import TRANSIENT, connect
from services.snapshot.app import DONE_HEADER
from services.worker.device import Device, build_device, run_rng
from services.worker.journal import Journal
from shared.model_format import ModelMessage, decode_model
from shared.settings import Settings
from shared.update import Update
from shared.wire import encode_update

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerResult:
    published: int = 0
    dropped_out: int = 0
    downloads: int = 0
    not_modified: int = 0
    done_reason: str | None = None


class ModelClient:
    """The newest model from the snapshot service, downloaded only when it changed."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, result: WorkerResult) -> None:
        self._session = session
        self._url = base_url.rstrip("/") + "/v1/models/latest"
        self._etag: str | None = None
        self.model: ModelMessage | None = None
        self.done: str | None = None
        self._result = result

    async def refresh(self, wait_s: float) -> None:
        """Conditional GET; before the first model exists, a long-poll for it."""
        headers = {"If-None-Match": self._etag} if self._etag else {}
        params = {} if self.model else {"newer_than": "-1", "wait": str(wait_s)}
        async with self._session.get(self._url, headers=headers, params=params) as response:
            self.done = response.headers.get(DONE_HEADER)
            if response.status == 304:
                self._result.not_modified += 1
                return
            if response.status == 204:  # still no model: ask again
                return
            response.raise_for_status()
            body = await response.read()
        self.model = decode_model(body)
        self._etag = response.headers.get("ETag")
        self._result.downloads += 1


async def publish(redis: aioredis.Redis, keys: Keys, raw: bytes, attempts: int) -> bytes:
    """XADD, retried with the same bytes on connection errors; never trims the stream."""
    for attempt in range(1, attempts + 2):
        try:
            entry_id: Any = await redis.xadd(keys.updates, {"m": raw})
            return bytes(entry_id)
        except TRANSIENT as exc:
            if attempt > attempts:
                raise
            log.warning("publish failed (%s); retrying the same update (attempt %d)", exc, attempt)
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
    raise AssertionError("unreachable")


async def _refresh(models: ModelClient, stopping: asyncio.Event) -> bool:
    """Refresh the model, riding out an unavailable snapshot service; False if stopping."""
    backoff = 0.1
    while not stopping.is_set():
        try:
            await models.refresh(wait_s=5.0)
            return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("snapshot service unavailable (%s); retrying in %.1f s", exc, backoff)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff)
            backoff = min(backoff * 2, 5.0)
    return False


async def work(
    settings: Settings,
    device: Device,
    redis: aioredis.Redis,
    session: aiohttp.ClientSession,
    stopping: asyncio.Event,
) -> WorkerResult:
    cfg = settings.worker
    keys = Keys(settings.redis.key_prefix)
    client_id = cfg.client_id or f"device-{cfg.device_index}"
    result = WorkerResult()
    models = ModelClient(session, cfg.snapshot_url, result)
    journal = Journal(cfg.journal)
    run = 0
    while not stopping.is_set():
        if not await _refresh(models, stopping):
            break
        if models.done:
            result.done_reason = models.done
            break
        if models.model is None:
            continue
        base = models.model.snapshot
        rng = run_rng(settings.task.seed, cfg.device_index, run)
        run += 1
        started = time.monotonic()
        train = device.train
        new, metrics = await asyncio.to_thread(
            device.task.train,
            base.weights.copy(),  # a private copy: the device never touches the served model
            device.data,
            rng,
            epochs=train.epochs,
            lr=train.lr,
            batch_size=train.batch_size,
        )
        if device.latency is not None:  # imitate this device's speed
            remaining = device.latency.sample(rng) - (time.monotonic() - started)
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), remaining)
        if stopping.is_set():
            break
        if cfg.dropout and rng.random() < cfg.dropout:
            result.dropped_out += 1
            log.info("run %d abandoned mid-training (dropout)", run)
            continue
        update = Update(
            update_id=uuid.uuid4().hex,
            client_id=client_id,
            base_version=base.version,
            num_samples=len(device.data),
            weights=new,
            created_at=time.time(),
            metrics=metrics,
        )
        raw = encode_update(update, settings.wire.dtype)
        journal.attempted(update.update_id)
        entry_id = await publish(redis, keys, raw, settings.redis.reconnect_attempts)
        journal.acknowledged(update.update_id, entry_id)
        result.published += 1
        if cfg.max_runs is not None and result.published >= cfg.max_runs:
            break
    return result


async def run(
    settings: Settings,
    *,
    redis: aioredis.Redis | None = None,
    handle_signals: bool = True,
    stopping: asyncio.Event | None = None,
) -> WorkerResult:
    stopping = stopping or asyncio.Event()
    device = build_device(settings.task, settings.worker)
    client = redis if redis is not None else connect(settings.redis)
    timeout = aiohttp.ClientTimeout(total=settings.worker.download_timeout_s)
    try:
        with stop_on_signals(stopping, handle_signals):
            async with aiohttp.ClientSession(timeout=timeout) as session:
                result = await work(settings, device, client, session, stopping)
        log.info(
            "worker %s: %d updates published, %d runs dropped out, %d downloads, %d not modified",
            settings.worker.client_id or settings.worker.device_index,
            result.published,
            result.dropped_out,
            result.downloads,
            result.not_modified,
        )
        return result
    finally:
        if redis is None:
            await client.aclose()
