"""A robust rule through the real aggregator: the ledger records what the core decided (the
excluded updates and the rule's detail), across a restart in the middle of a buffer, and
`ledger verify` replays it, format-4 checkpoint included."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run
from fedasync.services.ingest.app import create_app
from fedasync.services.runtime.redis_conn import get_bytes
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import add_device
from fedasync.services.stores.ledger import verify
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import read_headers, receipt_path
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Mode, RobustRule
from fedasync.shared.update import Update
from fedasync.shared.wire import unpack
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

K = 5


def robust(settings: Settings, rule: RobustRule) -> Settings:
    policy = settings.policy.model_copy(
        update={"mode": Mode.FEDBUFF, "buffer_size": K, "robust": rule, "robust_byzantine": 1}
    )
    return settings.model_copy(update={"policy": policy})


def script() -> list[Update]:
    """Two buffers of five and two more: in each buffer one update far from the others."""
    values = [0.0, 0.2, 40.0, 0.1, 0.3, 0.1, -30.0, 0.2, 0.0, 0.3, 0.1, 0.2]
    bases = [0] * K + [1] * K + [2, 2]
    return [
        make_update(f"u{i}", base=b, value=v, client=f"c{i % 4}")
        for i, (v, b) in enumerate(zip(values, bases, strict=True))
    ]


@pytest.mark.parametrize("rule", [RobustRule.MEDIAN, RobustRule.MULTI_KRUM])
async def test_the_ledger_records_what_the_robust_rule_decided_across_a_restart(
    settings: Settings, redis: aioredis.Redis, rule: RobustRule
) -> None:
    keys, config = Keys(settings.redis.key_prefix), robust(settings, rule)
    policy = config.policy.to_policy()
    expected = initial_state(settings)
    updates = script()
    decided = [expected.apply(u, policy).to_dict() for u in updates]

    for update in updates[:3]:  # stopped in the middle of the first buffer
        await publish(redis, keys, update)
    first = await run(
        config, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert first.version == 0
    raw = await get_bytes(redis, keys.state)
    assert raw is not None
    assert unpack(raw, max_bytes=len(raw))["format"] == 4  # the buffered updates, kept
    for update in updates[3:]:
        await publish(redis, keys, update)
    result = await run(config, redis=redis, handle_signals=False, burst=True)
    assert result.version == 2

    entries = await ledger(redis, keys)
    pairs = list(zip(entries, decided, strict=True))
    # every field the core decided, as it decided it, and only the service's context besides
    assert [{k: e[k] for k in d} for e, d in pairs] == decided
    assert all(set(e) - set(d) == {"stream_id", "at", "ledger_id"} for e, d in pairs)
    steps = [e for e in entries if e["server_step"]]
    if rule is RobustRule.MEDIAN:
        assert [s["detail"] for s in steps] == ["median: coordinate-wise of 5"] * 2
        assert all("excluded" not in e for e in entries)
    else:
        assert [s["excluded"] for s in steps] == [["u2"], ["u6"]]
        assert [s["detail"] for s in steps] == ["multi_krum: kept 4 of 5"] * 2
    report = await verify(redis, keys, config.wire.max_message_bytes)
    assert report.ok, report.describe()


async def test_a_receipt_leaves_out_the_other_devices_updates_the_rule_excluded(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """The ledger names the excluded updates; a device's receipt of the step does not (a
    receipt says nothing about other devices' updates), but keeps the rule's detail."""
    keys, config = Keys(settings.redis.key_prefix), robust(settings, RobustRule.MULTI_KRUM)
    key = parse_key(await add_device(redis, keys, "dev-a"))
    for update in [*script()[: K - 1], make_update("mine", base=0, value=0.2, client="dev-a")]:
        await publish(redis, keys, update)
    await run(
        config, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    step = (await ledger(redis, keys))[-1]
    assert (step["update_id"], step["excluded"]) == ("mine", ["u2"])
    client = TestClient(TestServer(create_app(settings, redis)))
    await client.start_server()
    try:
        headers = read_headers(key, "dev-a", int(time.time() * 1000), "mine")
        response = await client.get(receipt_path("mine"), headers=headers)
        assert response.status == 200
        receipt = await response.json()
    finally:
        await client.close()
    assert "excluded" not in receipt
    assert receipt["detail"] == "multi_krum: kept 4 of 5"
    assert receipt == {k: v for k, v in step.items() if k != "excluded"}
