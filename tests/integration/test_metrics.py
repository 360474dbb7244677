"""Metrics of every service: the figures the write-up asks for, valid Prometheus text (promtool)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from fedasync.learning.evaluation import Evaluation
from fedasync.services.aggregator.http import create_app
from fedasync.services.aggregator.service import Aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.control.app import create_app as create_control_app
from fedasync.services.evaluator.metrics import EvaluatorMetrics
from fedasync.services.ingest.app import create_app as create_ingest_app
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.app import create_app as create_snapshot_app
from fedasync.services.snapshot.app import wait_ready
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def run_once(settings: Settings, redis: aioredis.Redis) -> Aggregator:
    keys = Keys(settings.redis.key_prefix)
    for i in range(6):
        await publish(redis, keys, make_update(f"m{i}", base=0))
    await publish(redis, keys, make_update("m0", base=0))  # duplicate
    await publish(redis, keys, Update("bad", "c", 0, 1, np.ones(3, np.float32)))
    await publish(redis, keys, b"\xc1")
    aggregator = Aggregator(settings, redis, keys)
    await aggregator.start(initial_state(settings))
    await aggregator.run(asyncio.Event(), burst=True)
    return aggregator


async def test_metrics_count_decisions_tau_alpha_and_commits(
    settings: Settings, redis: aioredis.Redis
) -> None:
    aggregator = await run_once(settings, redis)
    app = create_app(aggregator.metrics, aggregator.ready, redis)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/livez")).status == 200
        assert (await client.get("/readyz")).status == 200
        text = await (await client.get("/metrics")).text()
    run = f'run="{settings.redis.key_prefix}"'  # every figure is labelled with its run
    assert f'fedasync_aggregator_decisions_total{{outcome="applied",{run}}} 6.0' in text
    assert f'fedasync_aggregator_decisions_total{{outcome="duplicate",{run}}} 1.0' in text
    assert f'fedasync_aggregator_rejections_total{{reason="shape_mismatch",{run}}} 1.0' in text
    assert f'fedasync_aggregator_rejections_total{{reason="malformed",{run}}} 1.0' in text
    assert f"fedasync_aggregator_staleness_count{{{run}}} 6.0" in text
    assert f"fedasync_aggregator_alpha_count{{{run}}} 6.0" in text
    assert f"fedasync_aggregator_step_norm_count{{{run}}} 6.0" in text
    assert f"fedasync_aggregator_model_version{{{run}}} 6.0" in text
    assert "fedasync_aggregator_commits_total" in text
    assert "client" not in text.replace("fedasync_", "")  # no client id as a label


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_metrics_pass_promtool(settings: Settings, redis: aioredis.Redis) -> None:
    aggregator = await run_once(settings, redis)
    text = generate_latest(aggregator.metrics.registry)
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_snapshot_metrics_pass_promtool(settings: Settings, redis: aioredis.Redis) -> None:
    await run_once(settings, redis)
    app = create_snapshot_app(settings, redis)
    async with TestClient(TestServer(app)) as client:
        await wait_ready(app)
        await client.get("/v1/models/latest")
        text = await (await client.get("/metrics")).read()
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_control_metrics_count_rule_actions_and_pass_promtool(
    settings: Settings, redis: aioredis.Redis
) -> None:
    await run_once(settings, redis)
    app = create_control_app(settings, redis, run_rules=False)
    async with TestClient(TestServer(app)) as client:
        token = {"Authorization": "Bearer not-configured-token"}
        await client.patch("/v1/policy", json={"changes": {"alpha0": 0.5}}, headers=token)
        text = await (await client.get("/metrics")).read()
    assert b"fedasync_control_policy_version 0.0" in text  # no token configured: refused
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def promtool_check(text: bytes) -> None:
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_evaluator_metrics_pass_promtool() -> None:
    metrics = EvaluatorMetrics()
    metrics.record(7, Evaluation(loss=0.4, num_samples=90, accuracy=0.8, per_class={0: 0.9}), 0.02)
    metrics.skipped.inc(3)
    text = generate_latest(metrics.registry)
    assert b'fedasync_evaluator_class_accuracy{class="0"} 0.9' in text
    promtool_check(text)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_ingest_metrics_pass_promtool(settings: Settings, redis: aioredis.Redis) -> None:
    async with TestClient(TestServer(create_ingest_app(settings, redis))) as client:
        refused = await client.post(
            "/v1/updates", data=b"x", headers={"Content-Type": "text/plain"}
        )
        assert refused.status == 415
        text = await (await client.get("/metrics")).read()
    assert b'fedasync_ingest_refusals_total{reason="unsupported_media_type"} 1.0' in text
    promtool_check(text)


async def test_readiness_is_lost_with_redis_while_the_aggregator_retries(
    settings: Settings, tmp_path: Path
) -> None:
    """Restored, but Redis gone: not ready (it decides nothing), as every other service says."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    redis_settings = settings.redis.model_copy(update={"url": server.url})
    settings = settings.model_copy(update={"redis": redis_settings})
    redis = connect(settings.redis)
    try:
        aggregator = await run_once(settings, redis)
        app = create_app(aggregator.metrics, aggregator.ready, redis)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/readyz")).status == 200
            server.stop()
            gone = await client.get("/readyz")
            assert gone.status == 503
            assert (await gone.json())["status"] == "redis unreachable"
    finally:
        server.stop()
        await redis.aclose()


async def test_the_epsilon_gauge_holds_the_newest_decisions_epsilon(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """With DP on, `fedasync_privacy_epsilon{model}` is the ε the newest ledger record carries,
    for each model the policy reports (sampled needs the population N); valid for promtool."""
    dp = settings.model_copy(
        update={
            "policy": type(settings.policy)(dp_clip=1.0, dp_population=100, dp_participation=100)
        }
    )
    aggregator = await run_once(dp, redis)
    text = generate_latest(aggregator.metrics.registry).decode()
    newest = (await ledger(redis, Keys(settings.redis.key_prefix)))[-1]
    assert newest["epsilon_conservative"] is not None
    assert newest["epsilon_sampled"] is not None
    for model in ("sampled", "conservative"):
        value = float(newest[f"epsilon_{model}"])
        assert f'fedasync_privacy_epsilon{{model="{model}"}} {value!r}' in text
    if shutil.which("promtool") is not None:
        promtool_check(text.encode())
