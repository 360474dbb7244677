"""The control service against a real Redis and the real aggregator: policy changes and auth."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.control.app import create_app
from fedasync.services.control.openapi import spec
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.services.stores.policy_store import policy_log
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "s3cret-operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    # reads open (an explicit choice; the default needs the token): these tests read anonymously
    control = settings.control.model_copy(update={"token": TOKEN, "open_reads": True})
    settings = settings.model_copy(update={"control": control})
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    async with TestClient(TestServer(create_app(settings, redis))) as test_client:
        yield test_client


async def test_operator_patch_changes_alpha_of_the_next_decisions(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    response = await client.patch(
        "/v1/policy",
        json={"changes": {"alpha0": 0.25}, "why": "calmer"},
        headers=AUTH | {"X-Fedasync-Operator": "alice"},
    )
    assert response.status == 200
    assert (await response.json())["policy"]["version"] == 1
    await publish(redis, keys, make_update("after", base=0))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    [entry] = await ledger(redis, keys)
    assert (entry["policy_version"], entry["alpha"]) == (1, 0.25)
    log = await policy_log(redis, keys)
    assert [(e["who"], e["why"], e["version"]) for e in log] == [("alice", "calmer", 1)]
    status = await (await client.get("/v1/status")).json()
    assert (status["version"], status["policy_version"], status["decisions"]) == (1, 1, 1)
    recent = status["recent"]
    assert recent["alpha"]["p50"] == 0.25
    assert recent["tau"]["max"] == 0.0
    assert recent["clients"] == [{"client": "c0", "applied": 1, "decided": 1, "rate": 1.0}]
    assert (status["pending"], status["lag"], status["switches_on"]) == (0, 0, [])
    assert status["budget_left_updates"] == settings.budget.max_updates - 1


async def test_invalid_values_get_422_with_field_and_range(client: TestClient) -> None:
    response = await client.patch("/v1/policy", json={"changes": {"gamma": -1}}, headers=AUTH)
    assert response.status == 422
    body = await response.json()
    assert (body["field"], body["allowed"]) == ("gamma", "(0, 10]")
    unknown = await client.patch("/v1/policy", json={"changes": {"alpha": 1}}, headers=AUTH)
    assert unknown.status == 422
    assert (await client.patch("/v1/policy", data=b"{", headers=AUTH)).status == 400
    for path, method in (("/v1/policy", client.patch), ("/v1/switches/raise-gamma", client.post)):
        not_utf8 = await method(path, data=b"\xff\xfe{}", headers=AUTH)
        assert not_utf8.status == 400, path
        assert "JSON" in (await not_utf8.json())["error"]


async def test_a_robust_rule_the_mode_cannot_take_gets_409_naming_it(client: TestClient) -> None:
    """The policy in force is FedAsync: a robust rule needs a buffered mode, named together."""
    alone = await client.patch("/v1/policy", json={"changes": {"robust": "median"}}, headers=AUTH)
    assert alone.status == 409  # a value its range allows, in conflict with the mode in force
    body = await alone.json()
    assert body["field"] == "robust"
    assert "mean unless mode is one of ['fedbuff', 'fedbuff-fair']" in body["allowed"]
    both = {"changes": {"mode": "fedbuff", "robust": "median"}, "why": "attack"}
    changed = await client.patch("/v1/policy", json=both, headers=AUTH)
    assert changed.status == 200
    assert (await changed.json())["policy"]["robust"] == "median"
    krum = {"changes": {"robust": "krum", "buffer_size": 4}}
    refused = await client.patch("/v1/policy", json=krum, headers=AUTH)
    assert refused.status == 409
    assert (await refused.json())["field"] == "robust_byzantine"
    shown = await (await client.get("/v1/policy")).json()
    assert (shown["policy"]["robust"], shown["policy"]["robust_trim"]) == ("median", 0.1)


async def test_writes_without_a_valid_token_are_refused(client: TestClient) -> None:
    missing = await client.patch("/v1/policy", json={"changes": {"alpha0": 0.5}})
    assert missing.status == 401
    assert "error" in await missing.json()
    wrong = await client.patch(
        "/v1/policy",
        json={"changes": {"alpha0": 0.5}},
        headers={"Authorization": "Bearer wrong-token-of-length"},
    )
    assert wrong.status == 403
    policy = await (await client.get("/v1/policy")).json()
    assert policy["policy"]["version"] == 0  # nothing changed
    assert policy["ranges"]["alpha0"] == "[0.001, 1]"


async def test_policy_history_shows_each_change_newest_first_with_who_and_why(
    client: TestClient,
) -> None:
    assert await (await client.get("/v1/policy/history")).json() == []  # no change made yet
    for alpha0, who, why in ((0.25, "alice", "calmer"), (0.5, "bob", "faster again")):
        response = await client.patch(
            "/v1/policy",
            json={"changes": {"alpha0": alpha0}, "why": why},
            headers=AUTH | {"X-Fedasync-Operator": who},
        )
        assert response.status == 200
    switched = await client.post(
        "/v1/switches/raise-gamma", json={"on": True, "reason": "spike"}, headers=AUTH
    )
    assert switched.status == 200
    response = await client.get("/v1/policy/history")
    assert response.status == 200
    history = await response.json()
    assert [(e["version"], e["who"], e["why"]) for e in history] == [
        (3, "operator", "switch raise-gamma on: spike"),  # no X-Fedasync-Operator header
        (2, "bob", "faster again"),
        (1, "alice", "calmer"),
    ]
    assert [e["policy"]["alpha0"] for e in history] == [0.5, 0.5, 0.25]
    assert [e["policy"]["version"] for e in history] == [3, 2, 1]
    assert all(isinstance(e["at"], float) for e in history)
    assert history[0]["at"] >= history[1]["at"] >= history[2]["at"] > 1_700_000_000
    policy = (await (await client.get("/v1/policy")).json())["policy"]
    assert history[0]["policy"] == policy
    # ?count=N: the N newest (its bounds: test_every_list_route_refuses_a_count_out_of_bounds)
    newest = await (await client.get("/v1/policy/history?count=2")).json()
    assert newest == history[:2]
    assert await (await client.get("/v1/policy/history?count=10000")).json() == history


@pytest.mark.parametrize("route", ["/v1/policy/history", "/v1/alerts", "/v1/evaluations"])
async def test_every_list_route_refuses_a_count_out_of_bounds(
    client: TestClient, route: str
) -> None:
    """One rule for `?count=` on every list route, as the OpenAPI document says: decimal digits
    in [1, 10000], else 400 (none clamps what another refuses)."""
    assert (await client.get(f"{route}?count=1")).status == 200
    assert (await client.get(f"{route}?count=10000")).status == 200
    for bad in ("0", "10001", "-1", "two", "+5", " 5", "05", "1e3", ""):
        answer = await client.get(route, params={"count": bad})
        assert answer.status == 400, (route, bad)
        assert "count" in (await answer.json())["error"]
    parameter = next(p for p in spec()["paths"][route]["get"]["parameters"] if p["name"] == "count")
    assert (parameter["schema"]["minimum"], parameter["schema"]["maximum"]) == (1, 10_000)


async def test_an_integral_json_number_is_taken_for_an_integer_parameter(
    client: TestClient,
) -> None:
    """JSON (and the OpenAPI document's JSON Schema) reads 500.0 as the integer 500: found by
    Schemathesis, it was a 422; 500.5 stays one."""
    changed = await client.patch(
        "/v1/policy", json={"changes": {"tau_max": 500.0}, "why": "w"}, headers=AUTH
    )
    assert changed.status == 200
    tau_max = (await changed.json())["policy"]["tau_max"]
    assert tau_max == 500
    assert isinstance(tau_max, int)
    refused = await client.patch(
        "/v1/policy", json={"changes": {"tau_max": 500.5}, "why": "w"}, headers=AUTH
    )
    assert refused.status == 422


async def test_a_query_key_a_route_does_not_take_is_a_400(client: TestClient) -> None:
    """The query keys each route takes are those its OpenAPI document names."""
    for url in ("/v1/alerts?zz=1", "/v1/status?count=1", "/v1/alerts?count=1&count=2"):
        answer = await client.get(url)
        assert answer.status == 400, url
        assert (await answer.json())["reason"] in ("unknown_query_key", "repeated_query_key")


async def test_policy_history_needs_the_token_unless_reads_are_open(
    closed_reads: TestClient,
) -> None:
    changed = await closed_reads.patch(
        "/v1/policy",
        json={"changes": {"alpha0": 0.3}, "why": "secret reason"},
        headers=AUTH | {"X-Fedasync-Operator": "carol"},
    )
    assert changed.status == 200
    missing = await closed_reads.get("/v1/policy/history")
    assert missing.status == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await closed_reads.get(
        "/v1/policy/history", headers={"Authorization": "Bearer wrong-token-of-length"}
    )
    assert wrong.status == 403
    for refused in (missing, wrong):
        text = await refused.text()
        assert "carol" not in text
        assert "secret reason" not in text
    allowed = await closed_reads.get("/v1/policy/history", headers=AUTH)
    assert allowed.status == 200
    [entry] = await allowed.json()
    assert (entry["version"], entry["who"], entry["why"]) == (1, "carol", "secret reason")


async def test_openapi_document_describes_every_route(client: TestClient) -> None:
    document = await (await client.get("/openapi.json")).json()
    assert document == spec()
    app: web.Application = client.server.app
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert routes == documented


async def test_switch_on_changes_the_policy_and_off_restores_it(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    on = await client.post(
        "/v1/switches/raise-gamma", json={"on": True, "reason": "rate spike"}, headers=AUTH
    )
    assert on.status == 200
    assert (await on.json())["policy"]["gamma"] == pytest.approx(0.9)
    listed = await (await client.get("/v1/switches")).json()
    assert listed["raise-gamma"]["on"] is True
    assert listed["raise-gamma"]["saved"] == {"gamma": 0.6}
    assert listed["lower-alpha"]["on"] is False
    again = await client.post("/v1/switches/raise-gamma", json={"on": True}, headers=AUTH)
    assert again.status == 409
    off = await client.post("/v1/switches/raise-gamma", json={"on": False}, headers=AUTH)
    policy = (await off.json())["policy"]
    assert (policy["gamma"], policy["version"]) == (0.6, 2)
    keys = Keys(settings.redis.key_prefix)
    whys = [e["why"] for e in await policy_log(redis, keys)]
    assert whys == ["switch raise-gamma on: rate spike", "switch raise-gamma off: "]
    assert (await client.post("/v1/switches/nope", json={"on": True}, headers=AUTH)).status == 404
    assert (await client.post("/v1/switches/lower-alpha", json={"on": True})).status == 401


async def test_pause_leaves_updates_in_the_stream_and_resume_decides_them(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    paused = await client.patch(
        "/v1/policy", json={"changes": {"paused": True}, "why": "maintenance"}, headers=AUTH
    )
    assert paused.status == 200
    await publish(redis, keys, make_update("waiting", base=0))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert await ledger(redis, keys) == []
    await client.patch("/v1/policy", json={"changes": {"paused": False}}, headers=AUTH)
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert [e["update_id"] for e in await ledger(redis, keys)] == ["waiting"]


async def test_a_budget_set_through_the_policy_ends_training(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    response = await client.patch(
        "/v1/policy", json={"changes": {"max_updates": 2}, "why": "enough"}, headers=AUTH
    )
    assert response.status == 200
    status = await (await client.get("/v1/status")).json()
    assert status["budget_left_updates"] == 2  # the policy's budget, not the configured 1000
    assert 0 < status["budget_left_seconds"] <= settings.budget.max_seconds
    for i in range(3):
        await publish(redis, keys, make_update(f"b{i}", base=min(i, 2)))
    result = await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert (result.version, result.closed) == (2, "max_updates")
    status = await (await client.get("/v1/status")).json()
    assert status["budget_left_updates"] == 0
    assert status["recent"]["totals"] == {"applied": 2, "dropped": 1}  # the third: closed
    bad = await client.patch("/v1/policy", json={"changes": {"max_updates": 0}}, headers=AUTH)
    assert (await bad.json())["field"] == "max_updates"


async def test_status_and_curve_show_the_evaluators_records(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    assert (await (await client.get("/v1/status")).json())["evaluation"] is None
    for version, accuracy in ((0, 0.1), (5, 0.5), (9, 0.8)):
        record = EvaluationRecord(
            version,
            10.0 + version,
            9.0 + version,
            1 - accuracy,
            accuracy,
            100,
            accuracy,
            {"0": accuracy, "1": accuracy / 2},
        )
        await evaluations.append(redis, keys, record, keep=1000)
    status = await (await client.get("/v1/status")).json()
    assert status["evaluation"]["version"] == 9
    assert status["evaluation"]["accuracy"] == 0.8
    curve = await (await client.get("/v1/evaluations", params={"count": "2"})).json()
    assert [r["version"] for r in curve] == [5, 9]  # the newest two, oldest first
    assert curve[1]["per_class"] == {"0": 0.8, "1": 0.4}
    assert (await client.get("/v1/evaluations", params={"count": "x"})).status == 400


# ------------------------------------------------------------------- hostile input (issue 12)
async def raw_request(client: TestClient, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request as exact bytes (headers an HTTP client library would refuse to send)."""
    server = client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(head + f"Content-Length: {len(body)}\r\n".encode() + b"\r\n" + body)
        reply = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


#: every route that checks the bearer token (reads need it unless reads are open)
TOKEN_ROUTES = [
    ("GET", "/v1/policy"),
    ("GET", "/v1/policy/history"),
    ("GET", "/v1/status"),
    ("GET", "/v1/switches"),
    ("GET", "/v1/alerts"),
    ("GET", "/v1/evaluations"),
    ("PATCH", "/v1/policy"),
    ("POST", "/v1/switches/raise-gamma"),
]


@pytest_asyncio.fixture
async def closed_reads(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    """The control service as configured by default (reads need the token), with a token."""
    settings = settings.model_copy(
        update={"control": settings.control.model_copy(update={"token": TOKEN})}
    )
    for i in range(3):
        await publish(redis, Keys(settings.redis.key_prefix), make_update(f"r{i}", base=0))
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as test_client:
        yield test_client


@pytest.mark.parametrize(("method", "path"), TOKEN_ROUTES)
@pytest.mark.parametrize("token", [b"\xc3\x28\xff\xfe", "é-not-the-token".encode()])
async def test_a_non_ascii_bearer_token_is_refused_not_a_500(
    closed_reads: TestClient, method: str, path: str, token: bytes
) -> None:
    head = f"{method} {path} HTTP/1.1\r\nHost: control\r\nConnection: close\r\n".encode()
    head += b"Authorization: Bearer " + token + b"\r\nContent-Type: application/json\r\n"
    status, body = await raw_request(closed_reads, head, b'{"on": true}')
    assert status == 403, body
    assert json.loads(body) == {"error": "invalid token"}


def nested(depth: int) -> bytes:
    return b'{"changes": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b', "on": true}'


@pytest.mark.parametrize("path", ["/v1/policy", "/v1/switches/raise-gamma"])
@pytest.mark.parametrize("body", [b"[" * 1000 + b"]" * 1000, nested(1000)], ids=["list", "map"])
async def test_json_nested_1000_deep_is_a_400(client: TestClient, path: str, body: bytes) -> None:
    method = client.patch if path == "/v1/policy" else client.post
    response = await method(path, data=body, headers=AUTH | {"Content-Type": "application/json"})
    assert response.status == 400
    assert "JSON" in (await response.json())["error"]
    policy = await (await client.get("/v1/policy")).json()
    assert policy["policy"]["version"] == 0  # nothing changed


async def test_a_compressed_body_is_refused_not_inflated(client: TestClient) -> None:
    body = gzip.compress(json.dumps({"changes": {"alpha0": 0.5}}).encode())
    headers = AUTH | {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    response = await client.patch("/v1/policy", data=body, headers=headers)
    assert response.status == 415
    assert "Content-Encoding" in (await response.json())["error"]


async def test_text_that_is_not_unicode_is_stored_with_replacement_characters(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    """A lone surrogate in JSON (`"\\ud800"`) or an operator header that is not UTF-8 could not
    be written to Redis (a 500 before); they are stored with U+FFFD in their place."""
    head = b"PATCH /v1/policy HTTP/1.1\r\nHost: control\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {TOKEN}\r\n".encode() + b"X-Fedasync-Operator: op\xff\r\n"
    status, answer = await raw_request(
        client, head, b'{"changes": {"alpha0": 0.5}, "why": "half \\ud800 a pair"}'
    )
    assert status == 200, answer
    [entry] = await policy_log(redis, Keys(settings.redis.key_prefix))
    assert (entry["who"], entry["why"]) == ("op\ufffd", "half \ufffd a pair")
    head = b"POST /v1/switches/raise-gamma HTTP/1.1\r\nHost: control\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {TOKEN}\r\n".encode()
    status, answer = await raw_request(client, head, b'{"on": true, "reason": "\\udfff"}')
    assert status == 200, answer


async def test_anonymous_reads_are_refused_by_default_so_no_client_id_is_shown(
    closed_reads: TestClient,
) -> None:
    for method, path in TOKEN_ROUTES:
        if method == "GET":
            anonymous = await closed_reads.get(path)
            assert anonymous.status == 401, path
            assert "c0" not in await anonymous.text()
    status = await (await closed_reads.get("/v1/status", headers=AUTH)).json()
    assert [row["client"] for row in status["recent"]["clients"]] == ["c0"]
    # health, metrics and the dashboard's page stay open (none of them names a client)
    for path in ("/livez", "/readyz", "/metrics", "/"):
        assert (await closed_reads.get(path)).status == 200, path


# ----------------------------------------------------------------------- budgets (issue 12)
async def test_a_budget_already_used_up_is_refused_with_409(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    """`max_seconds: 1e-9` would close training at once (and nothing could reopen it): 409, and
    the policy is unchanged. A budget still ahead is taken."""
    tiny = await client.patch("/v1/policy", json={"changes": {"max_seconds": 1e-9}}, headers=AUTH)
    assert tiny.status == 409
    assert (await tiny.json())["field"] == "max_seconds"
    keys = Keys(settings.redis.key_prefix)
    await publish(redis, keys, make_update("one", base=0))
    await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    used = await client.patch("/v1/policy", json={"changes": {"max_updates": 1}}, headers=AUTH)
    assert used.status == 409
    assert (await used.json())["used"] == 1
    policy = await (await client.get("/v1/policy")).json()
    assert policy["policy"]["version"] == 0
    assert (await client.get("/v1/status")).status == 200
    ahead = await client.patch("/v1/policy", json={"changes": {"max_updates": 5}}, headers=AUTH)
    assert ahead.status == 200


async def test_an_ended_training_stays_ended_and_says_so(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    """After a budget ended training, lifting it (null) or raising it is refused with 409: an
    end is final (docs/operations.md). Other policy changes are still taken."""
    keys = Keys(settings.redis.key_prefix)
    response = await client.patch("/v1/policy", json={"changes": {"max_updates": 2}}, headers=AUTH)
    assert response.status == 200
    for i in range(3):
        await publish(redis, keys, make_update(f"e{i}", base=min(i, 2)))
    result = await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert result.closed == "max_updates"
    for changes in ({"max_updates": None}, {"max_updates": 100}, {"max_seconds": None}):
        lifted = await client.patch("/v1/policy", json={"changes": changes}, headers=AUTH)
        assert lifted.status == 409, changes
        answer = await lifted.json()
        assert answer["training_done"]["reason"] == "max_updates"
        assert "cannot reopen" in answer["error"]
    other = await client.patch("/v1/policy", json={"changes": {"alpha0": 0.5}}, headers=AUTH)
    assert other.status == 200
    await publish(redis, keys, make_update("late", base=2))
    result = await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    assert (result.version, result.closed) == (2, "max_updates")


async def test_a_redis_error_reply_is_a_503_that_says_the_change_may_be_made(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    # an earlier release's policy log (a stream): the change script's RPUSH gets WRONGTYPE
    await redis.xadd(keys.policy_log, {"version": "0"})
    response = await client.patch(
        "/v1/policy", json={"changes": {"alpha0": 0.25}, "why": "calmer"}, headers=AUTH
    )
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    body = await response.json()
    assert "WRONGTYPE" in body["error"]
    assert "read it back before repeating it" in body["error"]
    metrics = await (await client.get("/metrics")).text()
    assert 'fedasync_control_redis_unavailable_total{kind="redis"} 1.0' in metrics
    assert 'fedasync_control_redis_unavailable_total{kind="connection"} 0.0' in metrics


async def test_redis_gone_is_a_503_with_retry_after_not_a_500(
    settings: Settings, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        redis_settings = settings.redis.model_copy(update={"url": server.url})
        settings = settings.model_copy(update={"redis": redis_settings})
        redis = connect(settings.redis)
        await run_aggregator(
            settings,
            redis=redis,
            initial=initial_state(settings),
            handle_signals=False,
            burst=True,
        )
        control = settings.control.model_copy(update={"token": TOKEN})
        app = create_app(settings.model_copy(update={"control": control}), redis, run_rules=False)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/v1/policy", headers=AUTH)).status == 200
            server.stop()
            read = await client.get("/v1/policy", headers=AUTH)
            assert (read.status, read.headers["Retry-After"]) == (503, "1")
            assert "read it back" not in (await read.json())["error"]  # a read changes nothing
            write = await client.patch(
                "/v1/policy", json={"changes": {"alpha0": 0.25}}, headers=AUTH
            )
            assert (write.status, write.headers["Retry-After"]) == (503, "1")
            assert "read it back before repeating it" in (await write.json())["error"]
            scrape = await client.get("/metrics")  # answered all the same: it counts the 503s
            assert scrape.status == 200
            metrics = await scrape.text()
        await redis.aclose()
    finally:
        server.stop()
    assert 'fedasync_control_redis_unavailable_total{kind="connection"} 2.0' in metrics
