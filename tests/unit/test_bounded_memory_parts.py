"""The pieces that keep Redis memory bounded: the dedup journal, a checkpoint without its ids,
the payload archive, and the one classification of an out-of-memory refusal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from fedasync.services.runtime import redis_conn
from fedasync.services.runtime.redis_conn import is_out_of_memory, retrying
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.archive import ArchiveError, PayloadArchive
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.layout import Layout
from fedasync.shared.wire import _all_finite


def test_the_journal_drains_what_was_remembered_since_the_last_drain() -> None:
    memory = DedupMemory(capacity=3)
    memory.remember("before", 0)
    memory.keep_journal()
    memory.remember("a", 1)
    memory.remember("b", 2)
    assert memory.drain() == [("a", 1), ("b", 2)]
    memory.remember("c", 3)  # over capacity: the lowest key ("before") is forgotten
    assert memory.drain() == [("c", 3)]
    assert memory.floor == 1
    assert memory.drain() == []


def test_a_journal_started_with_what_is_held_hands_it_over_first() -> None:
    memory = DedupMemory()
    memory.remember("x", 0)
    memory.keep_journal(with_current=True)
    assert memory.drain() == [("x", 0)]
    assert DedupMemory().drain() == []  # no journal kept: nothing to hand over


def test_a_checkpoint_without_dedup_ids_takes_them_back_from_the_caller() -> None:
    state = AggregationState(np.zeros(4, np.float32), Layout.flat(4))
    state.dedup.remember("u1", 0)
    raw = save_state(state, include_dedup_ids=False)
    assert len(load_state(raw).dedup) == 0
    restored = load_state(raw, dedup_ids=[("u1", 0)])
    assert "u1" in restored.dedup
    assert save_state(restored) == save_state(state)


def test_the_archive_gives_back_each_payload_by_stream_id(tmp_path: Path) -> None:
    archive = PayloadArchive(tmp_path, "run/1")
    archive.write([(b"1-0", b"one"), (b"1-1", b"")])
    archive.write([(b"2-0", b"two" * 1000)])
    assert archive.read("1-0") == b"one"
    assert archive.read("1-1") == b""
    assert archive.read("2-0") == b"two" * 1000
    assert archive.read("3-0") is None
    assert archive.write([]) is None
    assert [p.name for p in archive.segments()] == ["1-0_1-1.seg", "2-0_2-0.seg"]


def test_a_segment_cut_short_is_an_archive_error(tmp_path: Path) -> None:
    archive = PayloadArchive(tmp_path, "p")
    path = archive.write([(b"1-0", b"payload")])
    assert path is not None
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ArchiveError, match="cut short"):
        PayloadArchive(tmp_path, "p").read("1-0")


def test_out_of_memory_is_recognised_in_both_its_reply_forms() -> None:
    assert is_out_of_memory(OutOfMemoryError("command not allowed when used memory > 'maxmemory'"))
    wrapped = "Error running script: -OOM command not allowed when used memory > 'maxmemory'."
    assert is_out_of_memory(ResponseError(wrapped))
    assert not is_out_of_memory(ResponseError("NOPERM no permissions"))
    assert not is_out_of_memory(ConnectionError("refused"))


def test_retrying_waits_out_an_out_of_memory_refusal_and_reports_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_conn, "OOM_RETRY_S", 0.0)
    attempts: list[int] = []
    reported: list[BaseException] = []

    async def action() -> str:
        attempts.append(1)
        if len(attempts) < 4:
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
        return "written"

    async def on_oom(exc: BaseException) -> None:
        reported.append(exc)

    result = asyncio.run(retrying("commit", action, RedisSettings(), on_oom=on_oom))
    assert result == "written"
    assert len(attempts) == 4
    assert len(reported) == 3


def test_retrying_does_not_retry_other_error_replies() -> None:
    async def action() -> str:
        raise ResponseError("NOPERM no permissions")

    with pytest.raises(ResponseError, match="NOPERM"):
        asyncio.run(retrying("commit", action, RedisSettings()))


def test_the_float16_finiteness_check_on_bits_agrees_with_numpy_on_every_value() -> None:
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    expected = np.isfinite(every)
    assert [_all_finite(every[i : i + 1]) for i in range(65536)] == list(expected)
    assert _all_finite(every[expected])
