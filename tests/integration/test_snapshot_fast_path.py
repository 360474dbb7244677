"""The snapshot service's fast path (services/snapshot/fast.py) and its workers (service.py).

The fast path answers `latest` (200, 304) and `latest/meta` from ready bytes: those bytes must
be what aiohttp writes for the same request through app.py, counted the same, and the guard's
limits must hold on them. Several workers share the port: each serves, each follows versions
itself, so each freezes when Redis moves back in time, and a SIGTERM stops them all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import free_port
from fedasync.services.runtime.http_guard import log as guard_log
from fedasync.services.runtime.http_service import FAST_PATH
from fedasync.services.runtime.settings import HttpSettings, Settings
from fedasync.services.snapshot.app import CACHE, create_app, wait_ready
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]
#: how long a test waits for an event: generous, no timing claim
DEADLINE_S = 60.0
#: the guard's limits here: small, so it acts soon, and not so small that a stalled event loop
#: (a full GC, a starved CPU) lets them cut a well-behaved request
TIMEOUT_S = 1.0
WORKER = "fedasync_snapshot_worker"


async def commit(settings: Settings, redis: aioredis.Redis, ids: list[str]) -> None:
    """One commit per id (the first call also commits version 0)."""
    keys = Keys(settings.redis.key_prefix)
    if await redis.get(keys.version) is None:
        await run_aggregator(
            settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
        )
    for update_id in ids:
        version = int(await redis.get(keys.version) or 0)
        await publish(redis, keys, make_update(update_id, base=version))
        await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)


def configured(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "http": HttpSettings(header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S),
            "snapshot": settings.snapshot.model_copy(update={"port": 0}),
        }
    )


@asynccontextmanager
async def serving(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[int]:
    """The snapshot service (its own `run`, one process) with version 0; yields its port."""
    await commit(settings, redis, [])
    stopping = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_snapshot(
            configured(settings),
            redis=redis,
            handle_signals=False,
            stopping=stopping,
            started=started,
        )
    )
    try:
        port = await asyncio.wait_for(started, DEADLINE_S)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:  # the model is in memory once a long-poll for any version answers
            await exchange(reader, writer, head("/v1/models/latest?newer_than=-1&wait=60"))
        finally:
            writer.close()
        yield port
    finally:
        stopping.set()
        await asyncio.wait_for(task, DEADLINE_S)


def head(path: str, **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP answer: its head (without the Date line, which changes by the second), body."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    lines = [line for line in raw.split(b"\r\n") if not line.startswith(b"Date: ")]
    length = 0
    for line in lines:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
    return b"\r\n".join(lines), body


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[bytes, bytes]:
    writer.write(request)
    await writer.drain()
    return await read_answer(reader)


async def ask(port: int, request: bytes) -> tuple[bytes, bytes]:
    """One request on a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await exchange(reader, writer, request)
    finally:
        writer.close()


def header(answer_head: bytes, name: str) -> str:
    for line in answer_head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.decode().lower() == name.lower():
            return value.strip().decode()
    raise KeyError(name)


async def metrics(
    port: int, run: str | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The figures /metrics shows: the process's, and those of `run` (of any run for None: a
    test that holds one), without their `run` label."""
    _, body = await ask(port, head("/metrics"))
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "run"))): (
            sample.value
        )
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if run is None or sample.labels.get("run", run) == run
    }


# ---------------------------------------------------------------------------------- answers
async def test_the_fast_path_takes_latest_and_meta_and_leaves_the_rest_to_aiohttp(
    settings: Settings, redis: aioredis.Redis
) -> None:
    await commit(settings, redis, [])
    app = create_app(settings, redis)
    fast = app[FAST_PATH]
    async with TestServer(app):  # runs the app's follower; `fast.answer` is called directly
        await wait_ready(app)
        latest = app[CACHE].latest
        assert latest is not None
        etag = latest.etag
        taken = [
            head("/v1/models/latest"),
            head("/v1/models/latest", **{"If-None-Match": etag}),
            head("/v1/models/latest", Connection="keep-alive"),
            head("/v1/models/latest/meta"),
        ]
        declined = [
            head("/v1/models/latest?"),  # a query string: long-polls, formats
            head("/v1/models/latest?newer_than=0&wait=0"),
            head("/v1/models/0"),
            head("/v1/models/latest", Connection="close"),
            head("/v1/models/latest", **{"Content-Length": "0"}),
            head("/v1/models/latest", **{"If-None-Match": etag, "if-none-match": etag}),
            head("/v1/models/latest").replace(b"HTTP/1.1", b"HTTP/1.0"),
            head("/v1/models/latest").replace(b"Host: test", b"Host : test"),  # not a token
            head("/v1/models/latest").replace(b"Host: test", b"Host: t\x01est"),
            head("/livez"),
        ]
        assert all(fast.answer(request) is not None for request in taken)
        assert all(fast.answer(request) is None for request in declined)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/models/latest", {}),
        ("/v1/models/latest", {"If-None-Match": "ETAG"}),
        ("/v1/models/latest", {"If-None-Match": '"other", ETAG'}),
        ("/v1/models/latest", {"If-None-Match": '"v0-0000000000000000"'}),
        ("/v1/models/latest", {"If-None-Match": "W/ETAG"}),  # compared weakly: 304
        ("/v1/models/latest", {"If-None-Match": "*"}),
        ("/v1/models/latest/meta", {}),
    ],
)
async def test_fast_answers_are_the_bytes_aiohttp_writes(
    settings: Settings, redis: aioredis.Redis, path: str, headers: dict[str, str]
) -> None:
    """The same request, once plain (the fast path) and once with an empty query string (which
    the fast path declines, so app.py's handler answers): the same status, headers and body."""
    async with serving(settings, redis) as port:
        first, _ = await ask(port, head("/v1/models/latest"))
        etag = header(first, "ETag")
        headers = {k: v.replace("ETAG", etag) for k, v in headers.items()}
        before = await metrics(port)
        fast = await ask(port, head(path, **headers))
        slow = await ask(port, head(path + "?", **headers))
        after = await metrics(port)
    assert fast == slow
    status = fast[0].split(b" ")[1].decode()
    route = "meta" if path.endswith("/meta") else "latest"
    requests = ("fedasync_snapshot_requests_total", (("route", route), ("status", status)))
    assert after[requests] - before.get(requests, 0.0) == 2  # both counted, the same way


async def test_fast_answers_of_a_named_run_are_the_bytes_aiohttp_writes(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """`GET /v1/runs/<id>/models/latest[/meta]` of a run the worker holds: the fast path's bytes
    (plain) and aiohttp's (an empty query string) are the same, counted the same, in the run's
    own figures; and they are that run's answers, not the default run's."""
    run = f"{settings.redis.key_prefix}-a"
    await commit(
        settings.model_copy(
            update={"redis": settings.redis.model_copy(update={"key_prefix": run})}
        ),
        redis,
        ["a"],
    )  # run a at version 1; the default run (serving) at version 0
    path = f"/v1/runs/{run}/models/latest"
    async with serving(settings, redis) as port:
        first, _ = await ask(port, head(path))  # aiohttp's (the run is held from now on)
        assert header(first, "X-Fedasync-Version") == "1"
        legacy, _ = await ask(port, head("/v1/models/latest"))
        assert header(legacy, "X-Fedasync-Version") == "0"
        etag = header(first, "ETag")
        for asked, headers in (
            (path, {}),
            (path, {"If-None-Match": etag}),
            (path, {"If-None-Match": header(legacy, "ETag")}),  # the default run's: a 200
            (path + "/meta", {}),
        ):
            before = await metrics(port, run)
            fast = await ask(port, head(asked, **headers))
            slow = await ask(port, head(asked + "?", **headers))
            after = await metrics(port, run)
            assert fast == slow, (asked, headers)
            assert header(fast[0], "X-Fedasync-Version") == "1"
            status = fast[0].split(b" ")[1].decode()
            route = "meta" if asked.endswith("/meta") else "latest"
            requests = ("fedasync_snapshot_requests_total", (("route", route), ("status", status)))
            assert after[requests] - before.get(requests, 0.0) == 2, (asked, headers)


async def test_pipelined_requests_are_answered_in_order_across_the_hand_over(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Fast answers, then a request for aiohttp, then one more: aiohttp has the connection from
    the second on, and the answers come in the order asked."""
    async with serving(settings, redis) as port:
        first, body = await ask(port, head("/v1/models/latest"))
        etag = header(first, "ETag")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                head("/v1/models/latest", **{"If-None-Match": etag})
                + head("/v1/models/latest")
                + head("/livez")
                + head("/v1/models/latest", **{"If-None-Match": etag})
            )
            answers = [await read_answer(reader) for _ in range(4)]
        finally:
            writer.close()
    assert [a[0].split(b"\r\n")[0] for a in answers] == [
        b"HTTP/1.1 304 Not Modified",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 304 Not Modified",
    ]
    assert answers[1][1] == body
    assert answers[2][1] == b'{"status": "alive"}'


async def test_fast_answers_on_a_kept_alive_connection_are_each_counted_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Heads read one at a time (the guard's look-up of a known head) and pipelined in one write
    (split out, then answered): each answer counted once, as /metrics reads it."""
    async with serving(settings, redis) as port:
        first, _ = await ask(port, head("/v1/models/latest"))
        etag = header(first, "ETag")
        not_modified = head("/v1/models/latest", **{"If-None-Match": etag})
        before = await metrics(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            answers = [await exchange(reader, writer, not_modified) for _ in range(5)]
            writer.write(not_modified * 3 + head("/v1/models/latest/meta") * 2)
            answers += [await read_answer(reader) for _ in range(5)]
        finally:
            writer.close()
        after = await metrics(port)
        again = await metrics(port)
    assert [a[0].split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 304 Not Modified"] * 8 + [
        b"HTTP/1.1 200 OK"
    ] * 2

    def added(name: str, *labels: tuple[str, str]) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert added("fedasync_snapshot_requests_total", ("route", "latest"), ("status", "304")) == 8
    assert added("fedasync_snapshot_not_modified_total") == 8
    assert added("fedasync_snapshot_requests_total", ("route", "meta"), ("status", "200")) == 2
    snapshot = {k: v for k, v in after.items() if k[0].startswith("fedasync_snapshot_")}
    assert snapshot == {k: v for k, v in again.items() if k[0].startswith("fedasync_snapshot_")}


async def test_a_new_version_changes_the_fast_answers(
    settings: Settings, redis: aioredis.Redis
) -> None:
    async with serving(settings, redis) as port:
        first, old_body = await ask(port, head("/v1/models/latest"))
        old_etag = header(first, "ETag")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head("/v1/models/latest?newer_than=0&wait=60"))
            await writer.drain()
            await commit(settings, redis, ["a"])
            woken, _ = await read_answer(reader)
            assert header(woken, "X-Fedasync-Version") == "1"
        finally:
            writer.close()
        stale, new_body = await ask(port, head("/v1/models/latest", **{"If-None-Match": old_etag}))
        meta_head, meta = await ask(port, head("/v1/models/latest/meta"))
    assert stale.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert header(stale, "X-Fedasync-Version") == "1"
    assert header(stale, "ETag") != old_etag
    assert new_body != old_body
    assert header(meta_head, "X-Fedasync-Version") == "1"
    assert b'"version": 1' in meta


# ---------------------------------------------------------------------------- guard limits
@contextmanager
def logged(text: str) -> Iterator[asyncio.Event]:
    """An event set when the guard logs a line containing `text`."""
    event = asyncio.Event()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                event.set()

    handler = Handler()
    guard_log.addHandler(handler)
    try:
        yield event
    finally:
        guard_log.removeHandler(handler)


async def test_a_fast_path_head_that_never_completes_is_closed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    async with serving(settings, redis) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /v1/models/latest HTTP/1.1\r\nHost: te")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # closed, unanswered
        finally:
            writer.close()
        figures = await metrics(port)
    assert figures[("fedasync_http_connections_closed_total", (("reason", "header_timeout"),))] == 1


async def test_a_client_that_takes_none_of_its_fast_answers_is_cut_off(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """It pipelines model downloads and reads nothing: the fast path stops reading its requests
    once the answers back up, and the guard cuts it off when nothing moves for the timeout."""
    async with serving(settings, redis) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        _reader, writer = await asyncio.open_connection(sock=sock)
        try:
            with logged("took none of") as cut_off:
                writer.write(head("/v1/models/latest") * 20000)  # far more than any buffer
                await asyncio.wait_for(cut_off.wait(), DEADLINE_S)
        finally:
            writer.transport.abort()
        figures = await metrics(port)
    assert figures[("fedasync_http_connections_closed_total", (("reason", "send_timeout"),))] == 1


# --------------------------------------------------------------------------------- workers
@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def spawn_snapshot(
    settings: Settings, port: int, workers: int, log: Path
) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        FEDASYNC_REDIS__URL=str(settings.redis.url),
        FEDASYNC_REDIS__KEY_PREFIX=settings.redis.key_prefix,
        FEDASYNC_SNAPSHOT__PORT=str(port),
        FEDASYNC_SNAPSHOT__WORKERS=str(workers),
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fedasync.services.snapshot"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )


async def until_every_worker(port: int, workers: int, sample: str, value: float) -> None:
    """Ask /metrics on new connections (the kernel spreads them over the workers) until every
    worker has shown `sample` at `value` (another process offers no event to await)."""
    seen: set[str] = set()
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while len(seen) < workers:
        assert asyncio.get_running_loop().time() < deadline, f"only workers {seen}: {sample}"
        try:
            figures = await metrics(port)
        except (OSError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.05)
            continue
        if figures.get((sample, ())) == value:
            seen |= {dict(labels)["worker"] for name, labels in figures if name == WORKER}


async def test_every_worker_serves_and_freezes_when_redis_reports_an_older_version(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path, spawned: list[Any]
) -> None:
    keys = Keys(settings.redis.key_prefix)
    await commit(settings, redis, ["a", "b", "c"])  # versions 0..3
    port = free_port()
    spawned.append(spawn_snapshot(settings, port, 2, tmp_path / "snapshot.log"))
    await until_every_worker(port, 2, "fedasync_snapshot_model_version", 3)
    # the fault: Redis reports version 1 and announces it, as a restored older copy would
    await redis.set(keys.version, 1)
    await redis.publish(keys.versions_channel, 1)
    await until_every_worker(port, 2, "fedasync_snapshot_version_regressed", 1)
    for _ in range(20):  # whichever worker answers: frozen, still serving version 3
        ready, _ = await ask(port, head("/readyz"))
        assert ready.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable"
        latest, _ = await ask(port, head("/v1/models/latest"))
        assert header(latest, "X-Fedasync-Version") == "3"
    process = spawned[0]
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, DEADLINE_S) == 0
    with pytest.raises(
        ConnectionRefusedError
    ):  # every worker stopped with it: nobody listens any more
        await ask(port, head("/livez"))
    assert (tmp_path / "snapshot.log").read_text().count("draining and stopping") == 2


async def test_each_worker_holds_and_follows_the_runs_it_is_asked_for(
    settings: Settings, redis: aioredis.Redis, tmp_path: Path, spawned: list[Any]
) -> None:
    """Workers share nothing but the port: each holds a run once asked for it, and follows that
    run's versions itself (a commit of the run reaches every worker holding it)."""
    run = f"{settings.redis.key_prefix}-a"
    run_settings = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"key_prefix": run})}
    )
    await commit(settings, redis, [])
    await commit(run_settings, redis, ["a"])  # run a at version 1
    port = free_port()
    spawned.append(spawn_snapshot(settings, port, 2, tmp_path / "snapshot.log"))
    path = f"/v1/runs/{run}/models/latest"

    async def until_every_worker_serves(version: int) -> None:
        """Ask for the run on new connections (the kernel spreads them over the workers) until
        every worker's /metrics shows the run held at `version`."""
        seen: set[str] = set()
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while len(seen) < 2:
            assert asyncio.get_running_loop().time() < deadline, f"only workers {seen}"
            try:
                answer, _ = await ask(port, head(path))
                assert header(answer, "X-Fedasync-Version") in (str(version - 1), str(version))
                figures = await metrics(port, run)
            except (OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.05)
                continue
            if figures.get(("fedasync_snapshot_model_version", ())) == version:
                seen |= {dict(labels)["worker"] for name, labels in figures if name == WORKER}

    await until_every_worker_serves(1)
    await commit(run_settings, redis, ["b"])  # each worker's own follower takes version 2
    await until_every_worker_serves(2)
    process = spawned[0]
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, DEADLINE_S) == 0
