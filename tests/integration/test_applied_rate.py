"""One "applied per second": the live view (the control service's status) and the run summary
of `fedasync up` show the same figure for the same ledger (shared/stats.py AppliedRate)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.up import view
from fedasync.services.commands.up.summary import summarize
from fedasync.services.control.app import create_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.ledger import records
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "operator-token-for-the-rate"


def record(n: int, at: float, outcome: str, version: int) -> dict[str, Any]:
    """A ledger record as the aggregator commits it (the fields the figures read)."""
    return {
        "outcome": outcome,
        "update_id": f"u{n}",
        "client_id": f"device-{n % 3}",
        "base_version": max(version - 1, 0),
        "version": version,
        "policy_version": 0,
        "tau": 1,
        "alpha": 0.5 if outcome == "applied" else None,
        "reason": "stale" if outcome == "dropped" else None,
        "stream_id": f"{n + 1}-0",
        "at": at,
    }


async def test_the_live_view_and_the_summary_show_one_applied_rate(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await run_aggregator(  # genesis and the policy, as at the start of a run
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    # start-up until 1030 s (a drop before the first applied update), then 3 applied in 4 s
    written = [
        record(0, 1000.0, "dropped", 0),
        record(1, 1030.0, "applied", 1),
        record(2, 1031.0, "dropped", 1),
        record(3, 1032.0, "applied", 2),
        record(4, 1034.0, "applied", 3),
    ]
    for r in written:
        await redis.xadd(keys.ledger, {"d": msgpack.packb(r)})
    settings = settings.model_copy(
        update={"control": settings.control.model_copy(update={"token": TOKEN})}
    )
    app = create_app(settings, redis, run_rules=False)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        status = await response.json()
    ledger = [r async for r in records(redis, keys)]
    summary = summarize(
        ledger, [], ended_by="max_updates", dead_letters=0, started_at=990.0, wall_seconds=50.0
    )
    assert summary["applied_per_second"] == pytest.approx(2 / 4)
    assert status["recent"]["applied_per_second"] == summary["applied_per_second"]
    assert ("applied/s", "0.5") in view.figures(status)
