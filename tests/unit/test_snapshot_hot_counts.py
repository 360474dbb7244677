"""The snapshot fast path's answers (services/snapshot/fast.py) are counted in plain ints and
added to the Prometheus metrics when these are read: each answer exactly once, whenever and
however often they are scraped, across version changes (the sent bytes of each answer at its own
size), and the ready answers follow the version, the done flag and the second of their Date."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from fedasync.services.snapshot import fast
from fedasync.services.snapshot.cache import ModelCache, Served
from fedasync.services.snapshot.fast import RunAnswers
from fedasync.services.snapshot.metrics import RunMetrics

HOST = b"Host: 127.0.0.1:8080\r\n"


def served(version: int, size: int) -> Served:
    return Served(version, bytes(size), f"{version:064x}", 0.0, {"version": version})


def head(path: bytes, *lines: bytes) -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\n" + HOST + b"".join(lines) + b"\r\n"


def if_none_match(etag: str) -> bytes:
    return b"If-None-Match: " + etag.encode() + b"\r\n"


@pytest.fixture
def hot() -> tuple[RunAnswers, ModelCache, RunMetrics]:
    cache = ModelCache(2, 10)
    cache.latest = served(0, 100)
    metrics = RunMetrics()
    return RunAnswers(cache, metrics), cache, metrics


def figures(metrics: RunMetrics) -> dict[str, float | None]:
    """What a scrape reads (each read collects the registry, so folds first)."""
    get = metrics.registry.get_sample_value
    return {
        "304": get("fedasync_snapshot_requests_total", {"route": "latest", "status": "304"}),
        "200": get("fedasync_snapshot_requests_total", {"route": "latest", "status": "200"}),
        "meta": get("fedasync_snapshot_requests_total", {"route": "meta", "status": "200"}),
        "not_modified": get("fedasync_snapshot_not_modified_total"),
        "sent": get("fedasync_snapshot_sent_bytes_total"),
    }


def test_each_answer_is_counted_once_when_the_metrics_are_read(
    hot: tuple[RunAnswers, ModelCache, RunMetrics],
) -> None:
    answers, cache, metrics = hot
    assert cache.latest is not None
    not_modified = head(b"/v1/models/latest", if_none_match(cache.latest.etag))
    model = head(b"/v1/models/latest")
    meta = head(b"/v1/models/latest/meta")
    for request in (not_modified, model, meta):  # read once, through `answer`
        assert answers.answer(request) is not None
    for _ in range(4):  # then known: one look-up each
        assert answers.known(not_modified) is not None
        assert answers.known(model) is not None
    assert answers.known(meta) is not None
    # neither a head never answered nor a part of one is known: nothing answered, nothing counted
    assert answers.known(head(b"/v1/models/latest", b"Accept: */*\r\n")) is None
    assert answers.known(model[:-2]) is None
    assert answers.known(model + model) is None
    expected = {"304": 5.0, "200": 5.0, "meta": 2.0, "not_modified": 5.0, "sent": 500.0}
    assert figures(metrics) == expected
    assert figures(metrics) == expected  # a second scrape adds nothing
    assert b'fedasync_snapshot_requests_total{route="latest",status="304"} 5.0' in (
        generate_latest(metrics.registry)  # what /metrics answers
    )
    assert answers.known(not_modified) is not None
    assert figures(metrics)["304"] == 6.0


def test_answers_before_a_version_change_are_counted_at_their_own_size(
    hot: tuple[RunAnswers, ModelCache, RunMetrics],
) -> None:
    answers, cache, metrics = hot
    assert cache.latest is not None
    old = head(b"/v1/models/latest", if_none_match(cache.latest.etag))
    model = head(b"/v1/models/latest")
    assert answers.answer(model) is not None
    assert answers.known(model) is not None
    not_modified = answers.answer(old)
    assert not_modified is not None
    assert not_modified[0].startswith(b"HTTP/1.1 304 Not Modified\r\n")
    assert answers.known(old) == not_modified
    cache.latest = served(1, 300)
    # the ready answers were of version 0: known declines until `answer` rebuilt them
    assert answers.known(model) is None
    assert answers.known(old) is None
    new = answers.answer(old)  # the old ETag no longer matches: the new model
    assert new is not None
    assert new[1] == cache.latest.body
    assert b"X-Fedasync-Version: 1\r\n" in new[0]
    assert answers.known(old) == new
    assert figures(metrics) == {
        "304": 2.0,
        "200": 4.0,
        "meta": 0.0,
        "not_modified": 2.0,
        "sent": 2 * 100.0 + 2 * 300.0,
    }


def test_the_done_flag_and_closing_change_the_answers(
    hot: tuple[RunAnswers, ModelCache, RunMetrics],
) -> None:
    answers, cache, _ = hot
    model = head(b"/v1/models/latest")
    assert answers.answer(model) is not None
    cache.done = {"reason": "target reached"}
    assert answers.known(model) is None
    done = answers.answer(model)
    assert done is not None
    assert b"X-Fedasync-Training-Done: target reached\r\n" in done[0]
    assert answers.known(model) == done
    cache.closing = True  # shutting down: aiohttp answers (503s are its)
    assert answers.known(model) is None
    assert answers.answer(model) is None


def test_the_date_is_rebuilt_when_the_second_changes_either_way(
    hot: tuple[RunAnswers, ModelCache, RunMetrics], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers, _, _ = hot
    clock = [1_700_000_000.25]
    monkeypatch.setattr(fast, "_now", lambda: clock[0])
    model = head(b"/v1/models/latest")
    first = answers.answer(model)
    assert first is not None
    assert b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n" in first[0]
    clock[0] = 1_700_000_000.99  # the same second: the same bytes
    assert answers.known(model) == first
    clock[0] = 1_700_000_001.0  # the next second: rebuilt by `answer`
    assert answers.known(model) is None
    second = answers.answer(model)
    assert second is not None
    assert b"Date: Tue, 14 Nov 2023 22:13:21 GMT\r\n" in second[0]
    clock[0] = 1_700_000_000.5  # the clock stepped back: so does the Date
    assert answers.known(model) is None
    back = answers.answer(model)
    assert back is not None
    assert b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n" in back[0]
