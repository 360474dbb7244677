"""The device worker: fetch the model, train on a copy, publish the update, repeat.

A conditional GET makes an unchanged model cost a 304; training runs in a thread so the loop
stays responsive to SIGTERM; a slow device is imitated by waiting out its latency; a publish that
fails on the connection is retried with the same bytes (the same update id), which the
aggregator recognises as one update. The worker never trims the stream (no MAXLEN).

With a device key (`FEDASYNC_WORKER__KEY`) every update is signed (shared/device_auth.py). With
an ingest URL (`FEDASYNC_WORKER__INGEST_URL`) the worker holds no Redis credentials at all: it
POSTs the update to the ingest service, which authenticates it and adds it to the stream once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from fedasync.services.ingest.protocol import PATH, signed_headers
from fedasync.services.runtime.lifecycle import stop_on_signals
from fedasync.services.runtime.redis_conn import TRANSIENT, connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.app import DONE_HEADER
from fedasync.services.stores.keys import Keys
from fedasync.services.worker.device import Device, build_device, default_client_id, run_rng
from fedasync.services.worker.journal import Journal
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import Proof, parse_key, sign
from fedasync.shared.model_format import ModelMessage, decode_model
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerResult:
    published: int = 0
    dropped_out: int = 0
    downloads: int = 0
    not_modified: int = 0
    #: updates the ingest service refused for good (logged with their reason)
    refused: int = 0
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


class PublishAbandoned(Exception):
    """The worker was asked to stop while it waited to publish; the update was not sent."""


class PublishRefused(Exception):
    """The ingest service refused the update for good (a 4xx other than 429)."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status} {reason}: {detail}")


async def publish(
    redis: aioredis.Redis,
    keys: Keys,
    raw: bytes,
    attempts: int,
    signature: Proof | None = None,
) -> bytes:
    """XADD the entry (signed if `signature`), retried with the same bytes on connection
    errors; never trims the stream."""
    fields = stream_entry.build(raw, signature)
    for attempt in range(1, attempts + 2):
        try:
            entry_id: Any = await redis.xadd(keys.updates, fields)  # type: ignore[arg-type]
            return bytes(entry_id)
        except TRANSIENT as exc:
            if attempt > attempts:
                raise
            log.warning("publish failed (%s); retrying the same update (attempt %d)", exc, attempt)
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
    raise AssertionError("unreachable")


#: how long a Retry-After that is not a number of seconds (an HTTP-date, garbage) makes us wait
DEFAULT_RETRY_AFTER_S = 1.0
#: the longest Retry-After honoured: a misconfigured proxy must not park the device for hours
MAX_RETRY_AFTER_S = 60.0


def retry_after_s(value: str | None) -> float:
    """Seconds to wait from a Retry-After header: a finite, non-negative number of seconds,
    capped at MAX_RETRY_AFTER_S; anything else (absent, an HTTP-date, garbage) is
    DEFAULT_RETRY_AFTER_S. Ingest sends whole seconds; the other forms come from proxies."""
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    if not math.isfinite(seconds) or seconds < 0:
        return DEFAULT_RETRY_AFTER_S
    return min(seconds, MAX_RETRY_AFTER_S)


def json_object(body: bytes) -> dict[str, Any]:
    """The JSON object of an answer, or {} when it is not one: an error page from a proxy
    (HTML 502), aiohttp's own text 500, an empty body. Callers read fields with .get()."""
    try:
        answer = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return {}
    return answer if isinstance(answer, dict) else {}


def retryable(status: int) -> bool:
    """Worth sending the same bytes again: rate limited (429) or a server-side failure (5xx,
    ingest's own 503 or a proxy's 502/504); any other refusal is for good."""
    return status == 429 or 500 <= status <= 599


async def publish_http(
    session: aiohttp.ClientSession,
    base_url: str,
    key: bytes,
    client_id: str,
    raw: bytes,
    attempts: int,
    *,
    stopping: asyncio.Event | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> str:
    """POST to the ingest service, retried with the same bytes (signed afresh each time) on
    connection errors, 429 and 5xx; the update id makes the retries one update. The entry id.

    Between the device and ingest there may be a proxy, so an answer is not trusted to be
    ingest's JSON: a body that is not a JSON object reads as {} (a 4xx of that kind is a
    refusal with reason "unknown"), and a Retry-After that is not a number waits 1 s. A 202
    without an entry id is retried too: the same update id makes ingest answer it again.

    While the operators have paused ingest (503 `ingest_paused`) the device waits as long as it
    takes: that is a decision to come back later, not a failure, so it uses up no attempt.
    A wait between attempts ends early when `stopping` is set: the update is then given up
    (`PublishAbandoned`; it was never acknowledged) so a stop is not held up by a pause.
    `sleep` replaces that wait (tests pass one that records the waits instead).
    """
    stop = stopping or asyncio.Event()

    async def pause(seconds: float) -> None:
        if sleep is not None:
            await sleep(seconds)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)
        if stop.is_set():
            raise PublishAbandoned("stopping: the update was not published")

    url = base_url.rstrip("/") + PATH
    failures = 0
    while True:
        headers = signed_headers(key, client_id, int(time.time() * 1000), raw)
        wait = min(0.05 * 2 ** (failures + 1), 2.0)
        try:
            async with session.post(url, data=raw, headers=headers) as response:
                status = response.status
                answer = json_object(await response.read())
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        else:
            reason = str(answer.get("reason", "unknown"))
            if status == 202 and "entry_id" in answer:
                return str(answer["entry_id"])
            if status != 202 and not retryable(status):
                raise PublishRefused(status, reason, str(answer.get("error", "")))
            if status != 202:
                wait = max(wait, retry_after_s(retry_after))
            problem = f"{status} {reason}"
            if status == 503 and reason == "ingest_paused":
                log.info("ingest paused; trying again in %.0f s", wait)
                await pause(wait)
                continue
        failures += 1
        if failures > attempts:
            raise ConnectionError(f"ingest unavailable after {attempts} retries: {problem}")
        log.warning("publish failed (%s); retrying the same update (attempt %d)", problem, failures)
        await pause(wait)


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
    redis: aioredis.Redis | None,
    session: aiohttp.ClientSession,
    stopping: asyncio.Event,
) -> WorkerResult:
    cfg = settings.worker
    keys = Keys(settings.redis.key_prefix)
    client_id = cfg.client_id or default_client_id(cfg.device_index)
    key = None if cfg.key is None else parse_key(cfg.key.get_secret_value())
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
        attempts = settings.redis.reconnect_attempts
        journal.attempted(update.update_id)
        try:
            if cfg.ingest_url is not None and key is not None:
                entry_id = await publish_http(
                    session, cfg.ingest_url, key, client_id, raw, attempts, stopping=stopping
                )
            elif redis is None:
                raise ValueError("a worker without an ingest URL and key needs Redis")
            else:
                now_ms = int(time.time() * 1000)
                signature = None if key is None else sign(key, client_id, now_ms, raw)
                entry_id = (await publish(redis, keys, raw, attempts, signature)).decode()
        except PublishRefused as exc:
            result.refused += 1
            log.error("update %s refused: %s", update.update_id, exc)
            continue
        except PublishAbandoned:
            log.info("stopping: update %s was not published", update.update_id)
            break
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
    over_http = settings.worker.ingest_url is not None
    # a device publishing through ingest holds no Redis credentials and opens no connection
    client = redis if redis is not None or over_http else connect(settings.redis)
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
        if redis is None and client is not None:
            await client.aclose()
