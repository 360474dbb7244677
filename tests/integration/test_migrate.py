"""Upgrading over an earlier release's data: the policy log it kept as a stream.

The aggregator refuses to start on it (every policy change would fail with WRONGTYPE) and names
`fedasync migrate`, which converts it into the list today's release appends to, records intact.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main as cli
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.policy_store import (
    OldPolicyLog,
    change_policy,
    policy_log,
    read_policy,
)
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy
from tests.integration.helpers import initial_state, make_update, publish, wait_for_ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def write_old_policy_log(redis: aioredis.Redis, keys: Keys) -> list[dict[str, object]]:
    """Three changes as the earlier release's change script recorded them (XADD, flat fields)."""
    expected = []
    for version, alpha0 in enumerate((0.6, 0.5, 0.4)):
        policy = Policy.from_dict(Policy().to_dict() | {"version": version, "alpha0": alpha0})
        at = 1_700_000_000.123456789 + version
        encoded = json.dumps(policy.to_dict(), sort_keys=True)
        fields = {"version": version, "policy": encoded, "who": f"op{version}", "why": "tune"}
        await redis.xadd(keys.policy_log, fields | {"at": repr(at)})
        expected.append(
            {"version": version, "policy": policy.to_dict(), "who": f"op{version}"}
            | {"why": "tune", "at": at}
        )
    return expected


async def test_the_aggregator_refuses_an_old_policy_log_and_migrate_converts_it(
    settings: Settings,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = Keys(settings.redis.key_prefix)
    expected = await write_old_policy_log(redis, keys)

    with pytest.raises(OldPolicyLog, match="fedasync migrate"):
        await run_aggregator(settings, redis=redis, handle_signals=False)
    assert await redis.type(keys.policy_log) == b"stream"  # refused, nothing rewritten
    assert await redis.exists(keys.policy) == 0  # and no policy installed over the old history

    monkeypatch.setenv("FEDASYNC_REDIS__URL", settings.redis.url or "")
    monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", settings.redis.key_prefix)
    assert await asyncio.to_thread(cli, ["migrate"]) == 0
    assert "3 records converted from a stream to a list" in capsys.readouterr().out
    assert await policy_log(redis, keys) == expected  # same records, same order, `at` exact

    assert await asyncio.to_thread(cli, ["migrate"]) == 0  # a second run changes nothing
    assert "nothing to do" in capsys.readouterr().out
    assert await policy_log(redis, keys) == expected

    # the aggregator now starts, and the next change is appended after the converted records
    stopping = asyncio.Event()
    aggregator = asyncio.create_task(
        run_aggregator(
            settings,
            redis=redis,
            initial=initial_state(settings),
            handle_signals=False,
            stopping=stopping,
        )
    )
    try:
        await publish(redis, keys, make_update("u0", 0))
        await wait_for_ledger(redis, keys, "0-0", 1)  # running, its policy installed
        current = await read_policy(redis, keys)
        new = Policy.from_dict(current.to_dict() | {"version": current.version + 1})
        await change_policy(redis, keys, new, who="op", why="after upgrade", at=1.5)
    finally:
        stopping.set()
        await aggregator
    log = await policy_log(redis, keys)
    assert log[:3] == expected
    assert [(e["version"], e["why"]) for e in log[3:]] == [(new.version, "after upgrade")]


async def test_migrate_without_a_redis_says_which_variable_to_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FEDASYNC_REDIS__URL", raising=False)
    assert await asyncio.to_thread(cli, ["migrate"]) == 2  # settings missing: nothing started
    assert "FEDASYNC_REDIS__URL" in capsys.readouterr().err
