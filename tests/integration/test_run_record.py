"""Every process of a run builds the run's task; the control service counts the run's budget.

The aggregator records its task (name, params, seed) and budget in `{p}:run` at its start
(services/stores/run_record.py). A process started with another task is invalid settings: the
aggregator refuses before it raises the epoch (the running one is not fenced off), and one line
names each variable that differs. The control service computes the budget left from the
aggregator's budget, not from its own variables.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.app import create_app
from fedasync.services.runtime.settings import Settings, SettingsError
from fedasync.services.stores.run_record import check_task, recorded_task
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "run-record-test-token"


def changed(settings: Settings, section: str, **values: object) -> Settings:
    part = getattr(settings, section).model_copy(update=values)
    return settings.model_copy(update={section: part})


async def start_once(settings: Settings, redis: aioredis.Redis) -> None:
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )


async def test_an_aggregator_with_another_task_refuses_before_it_fences_anyone(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await start_once(settings, redis)
    assert await recorded_task(redis, keys) == {"name": "linear", "params": {}, "seed": 0}
    epoch = await redis.get(keys.epoch)

    other = changed(settings, "task", seed=5, params={"dim": 3})
    with pytest.raises(SettingsError) as refused:
        await start_once(other, redis)
    message = str(refused.value)
    assert "FEDASYNC_TASK__SEED: 5 here, but this run's task has 0" in message
    assert 'FEDASYNC_TASK__PARAMS: {"dim": 3} here, but this run\'s task has {}' in message
    assert "FEDASYNC_TASK__NAME" not in message  # the same: not named
    assert await redis.get(keys.epoch) == epoch  # the running aggregator was not fenced off

    await start_once(settings, redis)  # the run's own task starts again, as before
    await check_task(redis, keys, settings.task)  # an evaluator or a worker of the run: fine
    with pytest.raises(SettingsError, match="FEDASYNC_TASK__NAME"):
        await check_task(redis, keys, changed(settings, "task", name="digits").task)


async def test_the_budget_left_is_the_aggregators_not_the_control_services(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    aggregator = changed(settings, "budget", max_updates=40)
    await publish(redis, keys, make_update("u0", base=0))
    await start_once(aggregator, redis)
    control = changed(settings, "control", token=TOKEN)  # its own budget: the default
    assert control.budget.max_updates != 40
    app = create_app(control, redis, run_rules=False)
    async with TestClient(TestServer(app)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status = await (await client.get("/v1/status", headers=auth)).json()
        # one update applied of the aggregator's 40
        assert status["budget_left_updates"] == 39


async def test_the_aggregator_process_started_with_another_seed_exits_2_in_one_line(
    settings: Settings, redis: aioredis.Redis
) -> None:
    await start_once(settings, redis)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env |= {
        "FEDASYNC_REDIS__URL": str(settings.redis.url),
        "FEDASYNC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "FEDASYNC_TASK__NAME": "linear",
        "FEDASYNC_TASK__SEED": "5",
        "FEDASYNC_AGGREGATOR__PORT": "0",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fedasync.services.aggregator",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 2, err
    text = err.decode()
    assert "Traceback" not in text, text
    line = text.splitlines()[-1]  # after its log lines (the metrics port it opened)
    assert line.startswith("aggregator: invalid settings: FEDASYNC_TASK__SEED: 5 here"), text
