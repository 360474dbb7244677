"""A background task that dies on its own is heard of: logged on shutdown, seen by /readyz."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fedasync.services.runtime.lifecycle import Background, cancel_tasks

pytestmark = pytest.mark.asyncio


async def fail() -> None:
    raise RuntimeError("the loop broke")


async def forever() -> None:
    await asyncio.Event().wait()


async def test_cancel_tasks_logs_a_task_that_had_already_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = asyncio.create_task(fail(), name="loop")
    await asyncio.wait([task])  # it ended by itself, before anyone asked it to stop
    with caplog.at_level(logging.ERROR, logger="fedasync.services.runtime.lifecycle"):
        await cancel_tasks([task])
    [record] = caplog.records
    assert record.getMessage() == "task loop failed"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "the loop broke"


async def test_cancel_tasks_cancels_the_running_and_logs_the_failed_together(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = asyncio.create_task(fail(), name="failed")
    running = asyncio.create_task(forever(), name="running")
    await asyncio.wait([failed])
    with caplog.at_level(logging.ERROR, logger="fedasync.services.runtime.lifecycle"):
        await cancel_tasks([failed, running])
    assert running.cancelled()
    assert [r.getMessage() for r in caplog.records] == ["task failed failed"]


async def test_background_reports_a_task_that_died_but_not_one_that_was_stopped() -> None:
    died = Background()
    task = died.start(fail(), "follow")
    assert died.failure() is None  # not started running yet: no news is good news
    await asyncio.wait([task])
    assert died.failure() == "task follow failed: RuntimeError: the loop broke"

    stopped = Background()
    running = stopped.start(forever(), "rules")
    assert stopped.failure() is None
    await stopped.stop()
    assert running.cancelled()
    assert stopped.failure() is None  # asked to stop: that is no failure
