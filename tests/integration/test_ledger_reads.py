"""The ledger is read one way (stores/ledger.py: records): from a cursor, by the control service's
window and, once per run, by the run folder, whose ledger.jsonl is exactly the export."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.up.report import write_run_folder
from fedasync.services.commands.up.summary import summarize
from fedasync.services.control.window import LedgerWindow
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import ledger
from fedasync.services.stores.committed import read_committed
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def decide(settings: Settings, redis: aioredis.Redis, count: int) -> list[dict[str, Any]]:
    """`count` updates from three clients, one of them sent twice (a duplicate), decided."""
    keys = Keys(settings.redis.key_prefix)
    for i in range(count):
        await publish(redis, keys, make_update(f"u{i}", base=0, client=f"device-{i % 3}"))
    await publish(redis, keys, make_update("u0", base=0, client="device-0"))
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    return [r async for r in ledger.records(redis, keys)]


async def test_records_after_a_cursor_are_only_the_later_ones(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    everything = await decide(settings, redis, 7)
    assert len(everything) == 8
    ids = [r["ledger_id"] for r in everything]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    for cut in (0, 3, 7):
        later = [r async for r in ledger.records(redis, keys, page=2, after=ids[cut])]
        assert later == everything[cut + 1 :]
    paged = [r async for r in ledger.records(redis, keys, page=3)]
    assert paged == everything


async def test_the_window_takes_in_each_record_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    everything = await decide(settings, redis, 6)
    window = LedgerWindow(redis, keys, window_s=1e9, per_client=100)
    now = max(float(r["at"]) for r in everything)
    await window.refresh(now)
    await window.refresh(now)  # nothing new: nothing counted twice
    outcomes = [r["outcome"] for r in everything]
    assert dict(window.totals) == {o: outcomes.count(o) for o in set(outcomes)}
    assert window.totals["duplicate"] == 1
    # the dashboard's rows are the run summary's rows when the window holds every decision
    summary = summarize(
        everything, [], ended_by="test", dead_letters=0, started_at=None, wall_seconds=0.0
    )
    assert window.summary()["clients"] == summary["clients"]
    assert [c["client"] for c in summary["clients"]] == ["device-0", "device-1", "device-2"]


async def test_the_run_folder_reads_the_ledger_once_and_writes_the_export(
    settings: Settings,
    redis: aioredis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = Keys(settings.redis.key_prefix)
    everything = await decide(settings, redis, 5)
    exported = io.StringIO()
    assert await ledger.export(redis, keys, exported) == len(everything)
    reads: list[str] = []
    read_records = ledger.records

    def counted(*args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        reads.append("records")
        return read_records(*args, **kwargs)

    monkeypatch.setattr(ledger, "records", counted)
    summary = await write_run_folder(
        settings, tmp_path, ended_by="test", wall_seconds=1.0, extra={}
    )
    assert reads == ["records"]
    text = (tmp_path / "ledger.jsonl").read_text()
    assert text == exported.getvalue()
    assert [json.loads(line) for line in text.splitlines()] == everything
    assert summary["updates"]["decided"] == len(everything)


async def test_verify_replays_up_to_the_commit_it_began_at_while_later_commits_land(
    settings: Settings, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ledger verify` on a running system: a commit that lands while it replays is neither
    replayed nor compared with (it once read the ledger, then a newer commit's state)."""
    keys = Keys(settings.redis.key_prefix)
    decided = await decide(settings, redis, 5)
    began_at = await read_committed(redis, keys)
    read_records = ledger.records

    async def commits_meanwhile(*args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        landed = False
        async for record in read_records(*args, **kwargs):
            if not landed:  # the aggregator decides more while verify replays the first record
                landed = True
                for i in range(5, 9):
                    update = make_update(f"u{i}", base=began_at.version, client=f"device-{i % 3}")
                    await publish(redis, keys, update)
                await run_aggregator(
                    settings,
                    redis=redis,
                    initial=initial_state(settings),
                    handle_signals=False,
                    burst=True,
                )
            yield record

    monkeypatch.setattr(ledger, "records", commits_meanwhile)
    report = await ledger.verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.replayed == len(decided)
    assert report.version == began_at.version
    now = await read_committed(redis, keys)
    assert now.version == began_at.version + 4  # the later commits did land meanwhile
    assert now.state != began_at.state

    monkeypatch.undo()
    report = await ledger.verify(redis, keys, settings.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert report.replayed == len(decided) + 4
    assert report.version == now.version
