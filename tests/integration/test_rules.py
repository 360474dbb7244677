"""Automatic rules on a real ledger and stream: a rate spike, an injected lag, a starved client.

The rule runner's clock is injected and stepped by the test (no sleeps); the aggregator is the
real one, run in burst mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from fedasync.services.aggregator.service import Aggregator
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.control.app import create_app
from fedasync.services.control.rules_runner import RuleRunner
from fedasync.services.control.switchboard import set_switch, switch_owners
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.policy_store import policy_log, read_policy
from fedasync.shared.keys import Keys
from fedasync.shared.rules import ActionKind
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def runner(settings: Settings, redis: aioredis.Redis, clock: Clock, **cfg: Any) -> RuleRunner:
    control = settings.control.model_copy(update=cfg)
    return RuleRunner(control, redis, Keys(settings.redis.key_prefix), clock)


async def test_a_rate_spike_raises_gamma_and_calm_restores_it(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    relaxed = settings.model_copy(
        update={"policy": settings.policy.model_copy(update={"tau_max": 1000})}
    )
    for i in range(60):
        await publish(redis, keys, make_update(f"r{i}", base=0))
    await run_aggregator(
        relaxed, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    clock = Clock()
    rules = runner(
        settings,
        redis,
        clock,
        window_s=10.0,
        rate_high=3.0,
        rate_low=1.0,
        hold_s=5.0,
        cooldown_s=0.0,
    )
    assert await rules.tick() == []  # 6 updates/s, but not held for 5 s yet
    clock.now += 5
    [on] = await rules.tick()
    assert (on.kind, on.switch) == (ActionKind.SWITCH_ON, "raise-gamma")
    assert (await read_policy(redis, keys)).gamma == pytest.approx(0.9)
    clock.now += 10  # the burst has left the window: calm
    assert await rules.tick() == []
    clock.now += 5
    [off] = await rules.tick()
    assert off.kind is ActionKind.SWITCH_OFF
    policy = await read_policy(redis, keys)
    assert (policy.gamma, policy.version) == (0.6, 2)
    log = [e["who"] for e in await policy_log(redis, keys)]
    assert log == ["rule:update-rate", "rule:update-rate"]
    text = generate_latest(rules.metrics.registry).decode()
    assert 'fedasync_control_rule_actions_total{action="switch_on",rule="update-rate"} 1.0' in text
    assert 'fedasync_control_policy_changes_total{source="rule"} 2.0' in text


async def test_injected_lag_flips_freshest_only_and_clears_it(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    paused = Aggregator(settings, redis, keys)  # started, then "paused": it reads nothing
    await paused.start(initial_state(settings))
    for i in range(50):
        await publish(redis, keys, make_update(f"l{i}", base=0))
    clock = Clock()
    rules = runner(settings, redis, clock, lag_high=20.0, lag_low=5.0, hold_s=0.0, cooldown_s=0.0)
    [on] = await rules.tick()
    assert (on.kind, on.switch) == (ActionKind.SWITCH_ON, "freshest-only")
    assert (await read_policy(redis, keys)).tau_max == 0
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)  # catches up
    clock.now += 1
    actions = await rules.tick()
    [off] = [a for a in actions if a.kind is not ActionKind.ALERT]
    assert (off.kind, off.switch) == (ActionKind.SWITCH_OFF, "freshest-only")
    assert (await read_policy(redis, keys)).tau_max == 10
    # freshest-only dropped all but the newest: the drop alert says so
    assert "drops" in {a.rule for a in actions if a.kind is ActionKind.ALERT}


async def test_an_always_dropped_client_raises_a_fairness_alert(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    for i in range(30):
        await publish(redis, keys, make_update(f"f{i}", base=i, client="fast"))
    for i in range(12):
        await publish(redis, keys, make_update(f"s{i}", base=0, client="slow"))  # τ ≥ 30
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    clock = Clock()
    rules = runner(settings, redis, clock, fairness_min_rate=0.1, fairness_decisions=10)
    actions = await rules.tick()
    assert [(a.rule, a.client) for a in actions if a.kind is ActionKind.ALERT] == [
        ("fairness", "slow")
    ]
    token = "rules-test-operator-token"
    control = settings.control.model_copy(update={"token": token})
    app = create_app(settings.model_copy(update={"control": control}), redis, run_rules=False)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/v1/alerts")).status == 401  # alerts name clients: not open
        auth = {"Authorization": f"Bearer {token}"}
        alerts = await (await client.get("/v1/alerts", headers=auth)).json()
    assert alerts[0]["client"] == "slow"
    assert "0 of its last 10" in alerts[0]["message"]
    assert isinstance(alerts[0]["at"], float)  # Unix seconds, a number as everywhere else


async def test_a_rule_turns_its_switch_off_after_a_restart(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    paused = Aggregator(settings, redis, keys)
    await paused.start(initial_state(settings))
    for i in range(50):
        await publish(redis, keys, make_update(f"l{i}", base=0))
    clock = Clock()
    calm = {"lag_high": 20.0, "lag_low": 5.0, "hold_s": 0.0, "cooldown_s": 0.0}
    [on] = await runner(settings, redis, clock, **calm).tick()
    assert (on.kind, on.switch) == (ActionKind.SWITCH_ON, "freshest-only")
    # the control service restarts: a new runner, nothing in memory; meanwhile the lag clears
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    clock.now += 1
    restarted = runner(settings, redis, clock, **calm)
    [off] = [a for a in await restarted.tick() if a.kind is not ActionKind.ALERT]
    assert (off.kind, off.switch) == (ActionKind.SWITCH_OFF, "freshest-only")
    assert (await read_policy(redis, keys)).tau_max == 10
    assert await redis.hgetall(keys.switches) == {}


async def test_a_rule_leaves_an_operators_switch_alone(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await Aggregator(settings, redis, keys).start(initial_state(settings))
    await set_switch(redis, keys, "freshest-only", True, reason="by hand", who="ops")
    clock = Clock()
    rules = runner(settings, redis, clock, lag_high=20.0, lag_low=5.0, hold_s=0.0, cooldown_s=0.0)
    assert await rules.tick() == []  # calm, but not the rule's switch to turn off
    assert (await read_policy(redis, keys)).tau_max == 0
    for i in range(50):
        await publish(redis, keys, make_update(f"o{i}", base=0))
    clock.now += 1
    assert await rules.tick() == []  # lagging, but the switch is already on
    assert set(await switch_owners(redis, keys)) == {"freshest-only"}
    # once the operator turns it off, the rule decides again
    await set_switch(redis, keys, "freshest-only", False, reason="by hand", who="ops")
    clock.now += 1
    [on] = await rules.tick()
    assert (on.kind, on.switch) == (ActionKind.SWITCH_ON, "freshest-only")
    assert await switch_owners(redis, keys) == {"freshest-only": "rule:lag"}


class CountingClock(Clock):
    """Sets `stopping` when read for the `stop_at`-th time: each tick reads it once, first, so the
    loop has survived every tick before that one when it is read."""

    def __init__(self, stopping: asyncio.Event, stop_at: int) -> None:
        super().__init__()
        self.stopping = stopping
        self.stop_at = stop_at
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == self.stop_at:
            self.stopping.set()
        return self.now


async def test_a_refused_command_skips_a_run_and_the_rules_go_on(
    settings: Settings,
    redis: aioredis.Redis,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a control user whose rights were cut (NOPERM on everything but PING)
    user = f"{settings.redis.key_prefix}-noperm"
    await redis.acl_setuser(
        user, enabled=True, passwords=["+noperm-password-0123"], commands=["+ping"]
    )
    port = redis_server.port
    cut = connect(settings.redis, f"redis://{user}:noperm-password-0123@127.0.0.1:{port}/0")
    stopping = asyncio.Event()
    clock = CountingClock(stopping, stop_at=3)
    rules = runner(settings, cut, clock, rules_interval_s=0.01)
    try:
        with caplog.at_level(logging.ERROR, logger="fedasync.services.control.rules_runner"):
            await asyncio.wait_for(rules.run(stopping), timeout=30)
    finally:
        await cut.aclose()
        await redis.acl_deluser(user)
    assert clock.reads == 3  # three runs, each refused, and the loop ended only when asked to
    refusals = [r.getMessage() for r in caplog.records]
    assert len(refusals) == 3
    assert all("Redis refused" in m and "permission" in m for m in refusals), refusals
    text = generate_latest(rules.metrics.registry).decode()
    assert 'fedasync_control_rule_failures_total{reason="redis"} 3.0' in text
