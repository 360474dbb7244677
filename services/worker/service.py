"""The device worker: fetch the model, train on a copy, publish the update, repeat.

A device of a simulated fleet, built on the device client (fedasync.client), the one client
implementation: the client downloads the model (a conditional GET, so an unchanged model costs a
`304`), publishes the update through the ingest service (`FEDASYNC_WORKER__INGEST_URL`, signed with
`FEDASYNC_WORKER__KEY`, no Redis credentials at all) or straight to the stream (signed if a key is
set), retrying with the same update id. What the worker adds: its share of the data, training in a
thread so the loop stays responsive to SIGTERM, the latency of its profile (waited out), dropouts,
and the publish journal the chaos harness reads. It never trims the stream (no MAXLEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from fedasync.client import (
    Abandoned,
    DeviceClient,
    Model,
    PreparedUpdate,
    Refused,
    RetryPolicy,
    Unavailable,
    UnexpectedAnswer,
)
from fedasync.learning.dpsgd import private
from fedasync.services.runtime.lifecycle import stop_on_signals
from fedasync.services.runtime.own_run import own_run
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.run_record import RunCheck
from fedasync.services.worker import dpsgd_state
from fedasync.services.worker.device import Device, build_device, default_client_id, run_rng
from fedasync.services.worker.journal import Journal
from fedasync.shared.keys import Keys

log = logging.getLogger(__name__)

#: how long the worker long-polls for the first model before it asks again, seconds
FIRST_MODEL_WAIT_S = 5.0


@dataclass(slots=True)
class WorkerResult:
    published: int = 0
    dropped_out: int = 0
    downloads: int = 0
    not_modified: int = 0
    #: updates the ingest service refused for good (logged with their reason)
    refused: int = 0
    done_reason: str | None = None


async def _model(client: DeviceClient, stopping: asyncio.Event) -> Model | None:
    """The newest model (a long-poll before the first exists), riding out an unavailable
    snapshot service for as long as it takes; None if stopping (or no model yet)."""
    backoff = 0.1
    while not stopping.is_set():
        try:
            model = await client.latest()
            if model is None:
                model = await client.wait_newer(-1, FIRST_MODEL_WAIT_S)
            return model
        except Abandoned:
            return None
        except (Unavailable, UnexpectedAnswer) as exc:
            log.warning("snapshot service unavailable (%s); retrying in %.1f s", exc, backoff)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff)
            backoff = min(backoff * 2, 5.0)
    return None


async def work(
    settings: Settings,
    device: Device,
    redis: aioredis.Redis | None,
    stopping: asyncio.Event,
) -> WorkerResult:
    """Runs of fetch, train, publish until stopping, training is done or `max_runs` published."""
    cfg = settings.worker
    result = WorkerResult()
    # its data comes from the task: updates trained on another task's would mislead
    run_check = (
        None if redis is None else RunCheck(redis, Keys(settings.redis.key_prefix), settings.task)
    )
    if run_check is not None:
        await run_check.ensure()
    journal = Journal(cfg.journal)
    client = _client(settings, redis, stopping)
    async with client:
        run = 0
        while not stopping.is_set():
            base = await _model(client, stopping)
            if client.training_done:
                result.done_reason = client.training_done
                break
            if base is None:
                continue
            rng = run_rng(settings.task.seed, cfg.device_index, run)
            run += 1
            new, metrics = await _trained(device, base, rng, stopping)
            if device.privacy is not None and cfg.dpsgd_state is not None:
                # before anything is sent: a run the device sends is always in its saved ε
                dpsgd_state.save(Path(cfg.dpsgd_state), device.privacy)
            if stopping.is_set():
                break
            if cfg.dropout and rng.random() < cfg.dropout:
                result.dropped_out += 1
                log.info("run %d abandoned mid-training (dropout)", run)
                continue
            if run_check is not None:
                await run_check.ensure()
            update = client.prepare(new, base.version, len(device.data), metrics)
            if not await _publish(client, journal, update, result):
                break
            if cfg.max_runs is not None and result.published >= cfg.max_runs:
                break
        result.downloads = client.downloads.downloads
        result.not_modified = client.downloads.not_modified
    return result


def _client(
    settings: Settings, redis: aioredis.Redis | None, stopping: asyncio.Event
) -> DeviceClient:
    """The device client of this worker's device, as its settings configure it."""
    cfg = settings.worker
    return DeviceClient(
        cfg.snapshot_url,
        cfg.client_id or default_client_id(cfg.device_index),
        key=None if cfg.key is None else cfg.key.get_secret_value(),
        ingest_url=cfg.ingest_url,
        redis=redis,
        key_prefix=settings.redis.key_prefix,
        retry=RetryPolicy(attempts=settings.redis.reconnect_attempts),
        timeout_s=cfg.download_timeout_s,
        dtype=settings.wire.dtype,
        stopping=stopping,
        durability=settings.redis.durability,
        ca_file=cfg.ca_file,
        # the default run by its legacy routes and domain; another run by its own
        run=own_run(settings),
    )


async def _trained(
    device: Device, base: Model, rng: np.random.Generator, stopping: asyncio.Event
) -> tuple[np.ndarray, dict[str, float]]:
    """Local training from `base` in a thread (the loop stays responsive to SIGTERM), then the
    rest of this device's latency waited out (cut short by stopping)."""
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
        **private(device.privacy),
    )
    if device.latency is not None:  # imitate this device's speed
        remaining = device.latency.sample(rng) - (time.monotonic() - started)
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), remaining)
    return new, metrics


async def _publish(
    client: DeviceClient, journal: Journal, update: PreparedUpdate, result: WorkerResult
) -> bool:
    """Send `update`, journalled before and once acknowledged, and count it in `result` as
    published or refused (for good, logged with its reason); False if stopping abandoned it."""
    journal.attempted(update.update_id)
    try:
        published = await client.send(update)
    except Refused as exc:
        if client.training_done:  # 409 run_done: the loop ends as when the snapshot says so
            log.info("update %s not taken: the run finished training (%s)", update.update_id, exc)
            return True
        result.refused += 1
        log.error("update %s refused: %s", update.update_id, exc)
        return True
    except Abandoned:
        log.info("stopping: update %s was not published", update.update_id)
        return False
    journal.acknowledged(update.update_id, published.entry_id)
    result.published += 1
    return True


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
    try:
        with stop_on_signals(stopping, handle_signals):
            result = await work(settings, device, client, stopping)
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
