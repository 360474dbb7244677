"""The snapshot service against a real Redis and real commits: ETags, 304, versions, long-poll."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from safetensors.numpy import load as load_safetensors
from yarl import URL

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.app import (
    CACHE,
    DONE_HEADER,
    MODEL_CONTENT_TYPE,
    RUNS,
    VERSION_HEADER,
    create_app,
    follow,
    wait_ready,
)
from fedasync.services.snapshot.openapi import spec
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import decode_model
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def commit_updates(settings: Settings, redis: aioredis.Redis, ids: list[str]) -> None:
    keys = Keys(settings.redis.key_prefix)
    version = int(await redis.get(keys.version) or 0)
    for update_id in ids:
        await publish(redis, keys, make_update(update_id, base=version))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    app = create_app(settings, redis)
    async with TestClient(TestServer(app)) as test_client:
        await wait_ready(app)
        yield test_client


async def test_latest_with_etag_then_304(client: TestClient) -> None:
    first = await client.get("/v1/models/latest")
    assert first.status == 200
    assert first.headers["Content-Type"] == MODEL_CONTENT_TYPE
    assert first.headers[VERSION_HEADER] == "0"
    etag = first.headers["ETag"]
    assert etag.startswith('"v0-')
    model = decode_model(await first.read()).snapshot
    assert model.version == 0
    again = await client.get("/v1/models/latest", headers={"If-None-Match": etag})
    assert again.status == 304
    assert await again.read() == b""


async def test_new_commit_is_served_and_old_version_stays_immutable(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    old = await client.get("/v1/models/latest")
    waiting = asyncio.create_task(client.get("/v1/models/latest?newer_than=0&wait=10"))
    await commit_updates(settings, redis, ["a", "b"])
    newer = await waiting
    assert newer.status == 200
    assert newer.headers[VERSION_HEADER] == "2"
    stale = await client.get("/v1/models/latest", headers={"If-None-Match": old.headers["ETag"]})
    assert stale.status == 200  # the ETag no longer matches: a new download
    pinned = await client.get("/v1/models/0")
    assert pinned.status == 200
    assert "immutable" in pinned.headers["Cache-Control"]
    assert await pinned.read() == await old.read()


async def test_long_poll_times_out_with_204(client: TestClient) -> None:
    response = await client.get("/v1/models/latest?newer_than=0&wait=0.05")
    assert response.status == 204


async def test_evicted_and_unknown_versions_are_404(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keep = settings.aggregator.keep_versions
    for i in range(keep + 2):
        await commit_updates(settings, redis, [f"e{i}"])
    evicted = await client.get("/v1/models/1")
    assert evicted.status == 404
    assert (await evicted.json())["error"]
    assert (await client.get("/v1/models/999")).status == 404
    assert (await client.get("/v1/models/0")).status == 200  # the initial model is kept


#: spellings of version 0 that int() accepts (or a number that is no version), as they go
#: on the wire (percent-encoded): each is one more URL for an immutable, cached-for-ever answer
NOT_CANONICAL = [
    "-0",
    "+0",
    "0_0",
    "00",
    "%D9%A0",  # ARABIC-INDIC DIGIT ZERO
    "%EF%BC%90",  # FULLWIDTH DIGIT ZERO
    "%200",  # " 0"
    "0%0A",  # "0" and a line feed
    "1" * 20,  # longer than any version
    "9223372036854775808",  # 2**63
]


@pytest.mark.parametrize("spelling", NOT_CANONICAL)
async def test_a_version_has_one_spelling(client: TestClient, spelling: str) -> None:
    for path in (f"/v1/models/{spelling}", f"/v1/models/{spelling}/meta"):
        response = await client.get(URL(path, encoded=True))
        assert response.status == 400, (path, response.status)
        assert "decimal digits" in (await response.json())["error"]
    polled = await client.get(URL(f"/v1/models/latest?newer_than={spelling}&wait=0", encoded=True))
    assert polled.status == 400
    assert (await client.get("/v1/models/0")).status == 200  # the one spelling
    assert (await client.get("/v1/models/0/meta")).status == 200
    text = await (await client.get("/metrics")).text()
    run = client.server.app[RUNS].default.id  # every figure of a run is labelled with it
    assert (
        f'fedasync_snapshot_requests_total{{route="version",run="{run}",status="400"}} 1.0' in text
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("/v1/models/0?format=AAA", "bad_query_value"),
        ("/v1/models/0?format=", "bad_query_value"),
        ("/v1/models/0?zz=1", "unknown_query_key"),
        ("/v1/models/0?format=safetensors&format=safetensors", "repeated_query_key"),
        ("/v1/models/0?format=safetensors&zz=1", "unknown_query_key"),
        ("/v1/models/0/meta?format=safetensors", "unknown_query_key"),
        ("/v1/models/latest?zz=1", "unknown_query_key"),
        ("/v1/models/latest/meta?x", "unknown_query_key"),
    ],
)
async def test_an_immutable_version_has_no_other_cacheable_url(
    client: TestClient, url: str, reason: str
) -> None:
    """The edge caches by URL, query string included: a query key a route does not take, or a
    format that does not exist, is a 400 (JSON, not cacheable), never the immutable 200."""
    for method in ("GET", "HEAD"):
        response = await client.request(method, URL(url, encoded=True))
        assert response.status == 400, (method, url)
        assert "immutable" not in response.headers.get("Cache-Control", "")
    body = await (await client.get(URL(url, encoded=True))).json()
    assert body["reason"] == reason
    for good in ("/v1/models/0", "/v1/models/0?format=safetensors"):
        answer = await client.get(good)
        assert answer.status == 200
        assert answer.headers["Cache-Control"] == "public, max-age=31536000, immutable"


async def test_a_wait_that_is_no_number_is_a_400_also_without_newer_than(
    client: TestClient,
) -> None:
    """Found by Schemathesis: `?wait=null` alone was answered 200, the query ignored."""
    for url in ("/v1/models/latest?wait=null", "/v1/models/latest?wait=inf"):
        assert (await client.get(url)).status == 400, url
    assert (await client.get("/v1/models/latest?wait=1")).status == 200


async def test_latest_meta_long_polls_as_latest_does(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    """`latest/meta?newer_than=N&wait=S`: the version without the weights, once above N (the
    compose tests and `chaos --compose` poll it so); a version's meta takes no such keys."""
    timed_out = await client.get("/v1/models/latest/meta?newer_than=0&wait=0.05")
    assert timed_out.status == 204
    now = await client.get("/v1/models/latest/meta?newer_than=-1&wait=0")
    assert (await now.json())["version"] == 0
    waiting = asyncio.create_task(client.get("/v1/models/latest/meta?newer_than=0&wait=30"))
    await commit_updates(settings, redis, ["u1"])
    newer = await asyncio.wait_for(waiting, 60)
    assert newer.status == 200
    assert (await newer.json())["version"] == 1
    assert (await client.get("/v1/models/0/meta?newer_than=0")).status == 400


async def test_openapi_document_describes_every_route(client: TestClient) -> None:
    document = await (await client.get("/openapi.json")).json()
    assert document == spec()
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in client.server.app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    assert routes == {(path, method) for path, ops in document["paths"].items() for method in ops}


async def test_metadata_and_safetensors(client: TestClient) -> None:
    meta = await (await client.get("/v1/models/latest/meta")).json()
    assert meta["version"] == 0
    assert meta["parameters"] == 8
    assert meta["layout"] == [["w", [7]], ["b", [1]]]
    assert len(meta["sha256"]) == 64
    response = await client.get("/v1/models/latest?format=safetensors")
    tensors = load_safetensors(await response.read())
    assert tensors["w"].shape == (7,)
    assert tensors["b"].shape == (1,)


async def test_done_flag_is_announced(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    small = settings.model_copy(
        update={"budget": settings.budget.model_copy(update={"max_updates": 1})}
    )
    keys = Keys(settings.redis.key_prefix)
    await publish(redis, keys, make_update("last", base=0))
    waiting = asyncio.create_task(client.get("/v1/models/latest?newer_than=0&wait=10"))
    await run_aggregator(small, redis=redis, handle_signals=False, burst=True)
    response = await waiting
    assert response.headers[DONE_HEADER] == "max_updates"


async def test_health_and_metrics(client: TestClient) -> None:
    assert (await client.get("/livez")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200
    await client.get("/v1/models/latest")
    text = await (await client.get("/metrics")).text()
    run = client.server.app[RUNS].default.id
    assert f'fedasync_snapshot_requests_total{{route="latest",run="{run}",status="200"}}' in text
    assert f'fedasync_snapshot_model_version{{run="{run}"}} 0.0' in text


async def test_shutdown_answers_waiting_long_polls_at_once(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A long-poll in flight is answered 503 at shutdown instead of holding the shutdown."""
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    app = create_app(settings, redis)
    client = TestClient(TestServer(app))
    await client.start_server()
    await wait_ready(app)
    cache = app[CACHE]
    poll = asyncio.create_task(
        client.get("/v1/models/latest", params={"newer_than": "0", "wait": "3600"})
    )
    while cache.waiters == 0:  # the request is parked in the cache
        await asyncio.sleep(0)
    try:
        await client.server.close()  # shutdown: it must not wait an hour for the poll
        response = await poll
        assert response.status == 503
        assert (await response.json())["error"] == "shutting down"
    finally:
        await client.close()


async def test_the_etag_is_defined_by_the_body_and_each_representation_has_its_own(
    client: TestClient,
) -> None:
    """docs/http-api.md: "v<version>-<first 16 hex of sha256(body)>"; safetensors appends a tag."""
    response = await client.get("/v1/models/latest")
    body = await response.read()
    expected = f'"v0-{hashlib.sha256(body).hexdigest()[:16]}"'
    assert response.headers["ETag"] == expected
    other = await client.get("/v1/models/latest?format=safetensors")
    await other.read()
    assert other.headers["ETag"] == expected[:-1] + '-safetensors"'
    # each ETag revalidates its own representation only
    same = {"If-None-Match": expected}
    assert (await client.get("/v1/models/latest", headers=same)).status == 304
    crossed = await client.get("/v1/models/latest?format=safetensors", headers=same)
    assert crossed.status == 200


async def test_the_follower_ends_by_itself_once_the_cache_closes(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Shutdown must not depend on the follower seeing its cancellation: one that lands while
    redis-py's pub/sub read times out can be lost (redis-py 8.1, Python 3.11), and the service
    then never finished stopping. Closing the runs' caches alone ends the follower: it is
    never cancelled here."""
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    app = create_app(settings, redis)
    follower = asyncio.create_task(follow(app))
    assert await app[CACHE].wait_newer(-1, timeout=30) is not None  # following: it read v0
    await app[RUNS].close()
    done, _ = await asyncio.wait([follower], timeout=30)  # a deadline, not a sleep
    assert follower in done
    assert follower.result() is None


class Logged(logging.Handler):
    """Sets `seen` once a record containing `text` is logged: an event to await, not a sleep."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_an_error_reply_does_not_end_the_follower(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    refused = Logged("Redis refused")
    logger = logging.getLogger("fedasync.services.snapshot.app")
    logger.addHandler(refused)
    try:
        # the done flag is a hash; a string there makes the follower's HGETALL a WRONGTYPE reply
        await redis.set(keys.done, "not a hash")
        await asyncio.wait_for(refused.seen.wait(), 30)
        await redis.delete(keys.done)
    finally:
        logger.removeHandler(refused)
    # still following: a commit made after the error is announced to a long-poll
    waiting = asyncio.create_task(client.get("/v1/models/latest?newer_than=0&wait=30"))
    await commit_updates(settings, redis, ["after-error"])
    newer = await waiting
    assert (newer.status, newer.headers[VERSION_HEADER]) == (200, "1")
    metrics = await (await client.get("/metrics")).text()
    failures = re.search(
        r'fedasync_snapshot_follow_failures_total\{kind="redis",run="[^"]+"\} (\S+)', metrics
    )
    assert failures is not None
    assert float(failures.group(1)) >= 1


async def test_a_version_that_needs_an_absent_redis_is_a_503_not_a_500(
    settings: Settings, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        settings = settings.model_copy(
            update={"redis": settings.redis.model_copy(update={"url": server.url})}
        )
        redis = connect(settings.redis)
        await run_aggregator(
            settings,
            redis=redis,
            initial=initial_state(settings),
            handle_signals=False,
            burst=True,
        )
        app = create_app(settings, redis)
        async with TestClient(TestServer(app)) as client:
            await wait_ready(app)
            server.stop()
            held = await client.get("/v1/models/0")  # in memory: served without Redis
            assert held.status == 200
            absent = await client.get("/v1/models/999")  # only Redis knows: unavailable
            assert (absent.status, absent.headers["Retry-After"]) == (503, "1")
            assert "Redis unavailable" in (await absent.json())["error"]
        await redis.aclose()
    finally:
        server.stop()


async def test_before_the_first_model_latest_and_its_meta_are_503_not_a_missing_version(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Nothing committed yet (or Redis away since the start): `latest/meta` says so as `latest`
    does, not `404 version not kept`, which reads like a retention problem."""
    app = create_app(settings, redis)
    async with TestClient(TestServer(app)) as client:
        for path in ("/v1/models/latest", "/v1/models/latest/meta"):
            response = await client.get(path)
            assert response.status == 503, path
            assert (await response.json())["error"] == "no model committed yet"
