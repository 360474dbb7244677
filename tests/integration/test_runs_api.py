"""Runs in the control service, against a real Redis, the real control app and the real
aggregator: create, list, show, pause, stop (the aggregator closes the run "stopped", and
`ledger verify` replays it), the legacy routes as the default run's twins, the `fedasync runs`
CLI over a real socket, and run ids fuzzed into every run route (never a 5xx)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import requests
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main as cli_main
from fedasync.services.control.app import create_app
from fedasync.services.control.openapi import spec
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import ledger as ledger_store
from fedasync.services.stores.policy_store import policy_log
from fedasync.shared.keys import Keys
from fedasync.shared.runs import is_run_id
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration]

TOKEN = "runs-operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def run_id(settings: Settings, name: str) -> str:
    """A run id of this test's own (the directory of runs is one hash for the whole server)."""
    digest = hashlib.sha1(settings.redis.key_prefix.encode()).hexdigest()[:12]
    return f"r{digest}-{name}"


def with_token(settings: Settings, **control: Any) -> Settings:
    update = {"token": TOKEN, **control}
    return settings.model_copy(update={"control": settings.control.model_copy(update=update)})


def of_run(settings: Settings, run: str) -> Settings:
    """The settings of an aggregator of `run` (its key prefix is the run id)."""
    redis = settings.redis.model_copy(update={"key_prefix": run})
    return settings.model_copy(update={"redis": redis})


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient]:
    """The control service (reads closed: the default) over the default run, which has a
    model (its aggregator ran once)."""
    settings = with_token(settings)
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as test:
        yield test


def linear_run(run: str, **extra: Any) -> dict[str, Any]:
    return {"id": run, "task": {"name": "linear", "seed": 0}, **extra}


@pytest.mark.asyncio
async def test_a_run_is_created_listed_and_shown(client: TestClient, settings: Settings) -> None:
    run = run_id(settings, "a")
    body = linear_run(run, budget={"max_updates": 50}, policy={"alpha0": 0.3})
    created = await client.post(
        "/v1/runs", json=body, headers=AUTH | {"X-Fedasync-Operator": "alice"}
    )
    assert created.status == 201
    assert created.headers["Location"] == f"/v1/runs/{run}"
    shown = await created.json()
    assert (shown["id"], shown["status"], shown["version"], shown["training_done"]) == (
        run,
        "created",
        None,
        None,
    )
    assert shown["spec"]["created_by"] == "alice"
    assert shown["spec"]["created_at"] > 0
    assert (shown["spec"]["budget"], shown["spec"]["policy"]) == (
        {"max_updates": 50},
        {"alpha0": 0.3},
    )

    listed = (await (await client.get("/v1/runs", headers=AUTH)).json())["runs"]
    default = settings.redis.key_prefix
    assert listed[0] == {"id": default, "status": "training", "version": 0, "training_done": None}
    assert {"id": run, "status": "created", "version": None, "training_done": None} in listed

    again = await client.get(f"/v1/runs/{run}", headers=AUTH)
    assert (again.status, await again.json()) == (200, shown)
    default_shown = await (await client.get(f"/v1/runs/{default}", headers=AUTH)).json()
    assert (default_shown["status"], default_shown["spec"]) == ("training", None)


@pytest.mark.asyncio
async def test_create_refuses_taken_ids_bad_ids_and_bad_specs(
    client: TestClient, settings: Settings
) -> None:
    run = run_id(settings, "b")
    assert (await client.post("/v1/runs", json=linear_run(run), headers=AUTH)).status == 201

    async def refused(body: Any) -> tuple[int, str]:
        answer = await client.post("/v1/runs", json=body, headers=AUTH)
        said = await answer.json()
        assert set(said) >= {"error", "reason"}, said
        return answer.status, said["reason"]

    assert await refused(linear_run(run)) == (409, "run_exists")
    assert await refused(linear_run(settings.redis.key_prefix)) == (409, "run_exists")
    assert await refused({"id": "Not-A-Run"}) == (400, "bad_run_id")
    assert await refused({"id": "a/b"}) == (400, "bad_run_id")
    assert await refused({"task": {}}) == (400, "bad_run_id")  # no id at all
    other = run_id(settings, "c")
    assert await refused({"id": other, "created_by": "me"}) == (400, "bad_spec")
    assert await refused({"id": other, "colour": "red"}) == (400, "bad_spec")
    assert await refused({"id": other, "task": {"name": "nope"}}) == (400, "bad_spec")
    assert await refused({"id": other, "budget": {"max_updates": 0}}) == (400, "bad_spec")
    assert await refused({"id": other, "policy": {"alpha0": 5}}) == (400, "bad_spec")
    assert await refused({"id": other, "policy": {"paused": True}}) == (400, "bad_spec")
    assert await refused([1, 2]) == (400, "bad_spec")
    # start fields that cannot go together: the core's Conflict, as PATCH /v1/policy answers it
    assert await refused({"id": other, "policy": {"robust": "median"}}) == (409, "conflict")
    raw = await client.post("/v1/runs", data=b"{", headers=AUTH)
    assert raw.status == 400
    # none of the refused ids was created
    listed = (await (await client.get("/v1/runs", headers=AUTH)).json())["runs"]
    assert other not in {entry["id"] for entry in listed}
    # and the token is needed: a create without it is refused before anything is read
    assert (await client.post("/v1/runs", json=linear_run(other))).status == 401
    assert (await client.get(f"/v1/runs/{other}", headers=AUTH)).status == 404


@pytest.mark.asyncio
async def test_run_routes_refuse_bad_and_unknown_ids_with_the_reason(
    client: TestClient, settings: Settings
) -> None:
    for path in ("/v1/runs/Bad_Id/status", "/v1/runs/a%20b/policy", "/v1/runs/x%3Ay"):
        answer = await client.get(path, headers=AUTH)
        assert answer.status == 400, path
        assert (await answer.json())["reason"] == "bad_run_id"
    unknown = await client.get(f"/v1/runs/{run_id(settings, 'none')}/status", headers=AUTH)
    assert unknown.status == 404
    assert (await unknown.json())["reason"] == "unknown_run"
    # without the token the run's existence is not told: 401 first
    assert (await client.get(f"/v1/runs/{run_id(settings, 'none')}/status")).status == 401


@pytest.mark.asyncio
async def test_pause_resume_and_stop_and_the_aggregator_closes_the_run_stopped(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    run = run_id(settings, "s")
    assert (await client.post("/v1/runs", json=linear_run(run), headers=AUTH)).status == 201
    mine = of_run(settings, run)
    keys = Keys(run)
    # before its aggregator started the run has no policy: 409 not_started
    early = await client.post(f"/v1/runs/{run}/pause", json={"on": True}, headers=AUTH)
    assert (early.status, (await early.json())["reason"]) == (409, "not_started")
    await run_aggregator(
        mine, redis=redis, initial=initial_state(mine), handle_signals=False, burst=True
    )
    shown = await (await client.get(f"/v1/runs/{run}", headers=AUTH)).json()
    assert (shown["status"], shown["version"]) == ("training", 0)

    bob = AUTH | {"X-Fedasync-Operator": "bob"}
    paused = await client.post(
        f"/v1/runs/{run}/pause", json={"on": True, "why": "look"}, headers=bob
    )
    assert paused.status == 200
    assert (await paused.json())["policy"]["paused"] is True
    assert (await (await client.get(f"/v1/runs/{run}", headers=AUTH)).json())["status"] == "paused"
    twice = await client.post(f"/v1/runs/{run}/pause", json={"on": True}, headers=AUTH)
    assert (twice.status, (await twice.json())["reason"]) == (409, "already")
    # the default run is untouched by the other run's pause
    default_policy = await (await client.get("/v1/policy", headers=AUTH)).json()
    assert default_policy["policy"]["paused"] is False

    resumed = await client.post(f"/v1/runs/{run}/pause", json={"on": False}, headers=bob)
    assert (await resumed.json())["policy"]["paused"] is False
    await client.post(f"/v1/runs/{run}/pause", json={"on": True}, headers=bob)

    # an update waits; the run is stopped while paused (a stop closes all the same)
    await publish(redis, keys, make_update("late", base=0))
    stopped = await client.post(f"/v1/runs/{run}/stop", json={"reason": "enough"}, headers=bob)
    assert stopped.status == 200
    assert (await stopped.json())["policy"]["stopped"] is True
    # one-way: turning it off again is the core's Conflict, through the policy route too
    undo = await client.patch(
        f"/v1/runs/{run}/policy", json={"changes": {"stopped": False}}, headers=AUTH
    )
    assert undo.status == 409
    assert (await undo.json())["field"] == "stopped"
    again = await client.post(f"/v1/runs/{run}/stop", json={}, headers=AUTH)
    assert (again.status, (await again.json())["reason"]) == (409, "already")
    log = await policy_log(redis, keys)
    assert [(e["who"], e["why"]) for e in log] == [
        ("bob", "pause: look"),
        ("bob", "resume"),
        ("bob", "pause"),
        ("bob", "stop: enough"),
    ]

    await run_aggregator(mine, redis=redis, handle_signals=False, burst=True)
    shown = await (await client.get(f"/v1/runs/{run}", headers=AUTH)).json()
    assert shown["status"] == "done"
    assert shown["training_done"]["reason"] == "stopped"
    [record] = await ledger(redis, keys)  # the waiting update, dropped: the run is closed
    assert (record["outcome"], record["detail"]) == ("dropped", "stopped")
    report = await ledger_store.verify(redis, keys, mine.wire.max_message_bytes)
    assert report.ok, report.describe()
    assert (report.replayed, dict(report.outcomes)) == (1, {"dropped": 1})
    after = await client.post(f"/v1/runs/{run}/stop", json={}, headers=AUTH)
    assert (after.status, (await after.json())["reason"]) == (409, "training_done")
    # the default run trains on
    status = await (await client.get("/v1/status", headers=AUTH)).json()
    assert status["training_done"] is None


#: the legacy routes every run has a twin of (reads: compared answer for answer)
LEGACY_READS = (
    "/v1/policy",
    "/v1/policy/history",
    "/v1/switches",
    "/v1/alerts",
    "/v1/evaluations",
    "/v1/status",
)


@pytest.mark.asyncio
async def test_the_legacy_routes_answer_as_the_default_run_s_twins(
    client: TestClient, settings: Settings
) -> None:
    flipped = await client.post(
        "/v1/switches/raise-gamma", json={"on": True, "reason": "r"}, headers=AUTH
    )
    assert flipped.status == 200
    default = settings.redis.key_prefix
    for path in LEGACY_READS:
        legacy = await client.get(path, headers=AUTH)
        twin = await client.get(f"/v1/runs/{default}{path.removeprefix('/v1')}", headers=AUTH)
        assert (legacy.status, twin.status) == (200, 200), path
        if path == "/v1/status":  # the seconds left tick between the two reads
            mine, theirs = await legacy.json(), await twin.json()
            mine.pop("budget_left_seconds")
            theirs.pop("budget_left_seconds")
            assert mine == theirs
        else:
            assert await legacy.read() == await twin.read(), path
    # a write through the twin is the default run's too
    patched = await client.patch(
        f"/v1/runs/{default}/policy", json={"changes": {"alpha0": 0.2}}, headers=AUTH
    )
    assert patched.status == 200
    assert (await (await client.get("/v1/policy", headers=AUTH)).json())["policy"]["alpha0"] == 0.2


@pytest.mark.asyncio
async def test_the_document_names_every_run_route(client: TestClient) -> None:
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
    for path in LEGACY_READS:
        assert f"/v1/runs/{{run}}{path.removeprefix('/v1')}" in document["paths"]


class Served:
    """The control service on a socket, in a loop of its own thread (for sync callers: the CLI
    and Hypothesis)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self.call(self._start())

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    async def _start(self) -> str:
        self.redis = connect(self.settings.redis)
        await run_aggregator(
            self.settings,
            redis=self.redis,
            initial=initial_state(self.settings),
            handle_signals=False,
            burst=True,
        )
        self.runner = web.AppRunner(create_app(self.settings, self.redis, run_rules=False))
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.redis.aclose()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    server = Served(with_token(settings))
    try:
        yield server
    finally:
        server.close()


def test_the_runs_cli_creates_lists_shows_pauses_and_stops(
    served: Served, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_id(settings, "cli")
    common = ["runs", "--url", served.url, "--token", TOKEN, "--operator", "carol"]
    created = [
        *common,
        "create",
        run,
        "--task",
        "linear",
        "--seed",
        "2",
        "--budget",
        "max_updates=9",
    ]
    assert cli_main(created) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["status"], shown["spec"]["created_by"]) == (run, "created", "carol")
    assert shown["spec"]["task"]["seed"] == 2
    assert shown["spec"]["budget"] == {"max_updates": 9}
    assert cli_main([*common, "create", run]) == 1
    assert "[run_exists]" in capsys.readouterr().err
    assert cli_main([*common, "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "STATUS", "VERSION", "DONE"]
    assert lines[1].split() == [settings.redis.key_prefix, "training", "0", "-"]
    assert [run, "created", "-", "-"] in [line.split() for line in lines]
    assert cli_main([*common, "show", run]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["id"] == run
    # pause, resume and stop need the run's policy (its aggregator started)
    mine = of_run(served.settings, run)
    served.call(
        run_aggregator(
            mine, redis=served.redis, initial=initial_state(mine), handle_signals=False, burst=True
        )
    )
    assert cli_main([*common, "pause", run, "--why", "check"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["paused"] is True
    assert cli_main([*common, "resume", run]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["paused"] is False
    assert cli_main([*common, "stop", run, "--reason", "done here"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["stopped"] is True
    log = served.call(policy_log(served.redis, Keys(run)))
    assert [(e["who"], e["why"]) for e in log] == [
        ("carol", "pause: check"),
        ("carol", "resume"),
        ("carol", "stop: done here"),
    ]
    assert cli_main([*common, "show", "Bad"]) == 2  # refused before anything is sent
    wrong = ["runs", "--url", served.url, "--token", "wrong", "list"]
    assert cli_main(wrong) == 1
    assert "403" in capsys.readouterr().err


#: every run route, by method, with a body that route takes (the id is what is fuzzed)
RUN_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "", None),
    ("GET", "/status", None),
    ("GET", "/policy", None),
    ("PATCH", "/policy", {"changes": {"alpha0": 0.5}}),
    ("GET", "/policy/history", None),
    ("GET", "/switches", None),
    ("POST", "/switches/raise-gamma", {"on": True}),
    ("GET", "/alerts", None),
    ("GET", "/evaluations", None),
    ("POST", "/pause", {"on": True}),
    ("POST", "/stop", {"reason": "fuzz"}),
    ("DELETE", "", None),
    ("PUT", "/status", None),
)


def test_fuzzed_run_ids_in_every_route_and_method_never_get_a_5xx(served: Served) -> None:
    """Any text as the run id, percent-encoded into the path: a 400 (bad_run_id) or a 404
    (unknown_run, or a path no route has), a 405 for a method a route lacks; never a 5xx."""
    session = requests.Session()
    seen: dict[int, int] = {}

    @hypothesis_settings(
        max_examples=100,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(text=st.text(max_size=80))
    def check(text: str) -> None:
        # "." and ".." too: a client would resolve them as path segments before sending
        encoded = quote(text, safe="").replace(".", "%2E")
        for method, tail, body in RUN_ROUTES:
            answer = session.request(
                method,
                f"{served.url}/v1/runs/{encoded}{tail}",
                json=body,
                headers=AUTH,
                timeout=30,
            )
            seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
            assert answer.status_code < 500, (method, tail, text, answer.text)
            said = answer.json()
            assert "error" in said
            if is_run_id(text) and method not in ("DELETE", "PUT"):
                assert (answer.status_code, said.get("reason")) == (404, "unknown_run")
            elif answer.status_code == 400:
                assert said["reason"] == "bad_run_id", (text, said)

    check()
    session.close()
    # the fuzz reached both refusals (and, on the default run's id, nothing was harmed)
    assert seen.get(400, 0) > 0
    assert seen.get(404, 0) > 0
    assert served.call(served.redis.exists(Keys(served.settings.redis.key_prefix).done)) == 0


@pytest.mark.asyncio
async def test_the_rules_of_every_active_run_are_ticked_and_not_the_others(
    client: TestClient, settings: Settings, redis: aioredis.Redis
) -> None:
    """The control service's rules for runs other than the default one (RunsRules): a run
    training gets its own RuleRunner over its own ledger; a run not started has none."""
    from fedasync.services.control.app import CLIENTS, METRICS, WINDOWS
    from fedasync.services.control.rules_runner import RunsRules

    training, waiting = run_id(settings, "t"), run_id(settings, "w")
    for run in (training, waiting):
        assert (await client.post("/v1/runs", json=linear_run(run), headers=AUTH)).status == 201
    mine = of_run(settings, training)
    await publish(redis, Keys(training), make_update("u0", base=0))
    await run_aggregator(
        mine, redis=redis, initial=initial_state(mine), handle_signals=False, burst=True
    )
    app = client.server.app  # type: ignore[attr-defined]
    rules = RunsRules(settings.control, app[CLIENTS], app[WINDOWS], app[METRICS])
    ticked = await rules.tick()
    assert training in ticked
    assert waiting not in ticked
    assert settings.redis.key_prefix not in ticked  # the default run has its own runner
    # the run's window read the run's own ledger: its one decision, nothing of the default's
    window = app[WINDOWS].of(training, redis)
    assert window.totals == {"applied": 1}
    status = await (await client.get(f"/v1/runs/{training}/status", headers=AUTH)).json()
    assert (status["version"], status["decisions"]) == (1, 1)
    assert status["recent"]["totals"] == {"applied": 1}


@pytest.mark.asyncio
async def test_before_any_aggregator_the_default_run_s_twin_answers_as_its_legacy_route(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """No policy yet: the legacy route's 503, on its twin too; a created run's is 409."""
    settings = with_token(settings)
    async with TestClient(TestServer(create_app(settings, redis, run_rules=False))) as client:
        legacy = await client.get("/v1/policy", headers=AUTH)
        twin = await client.get(f"/v1/runs/{settings.redis.key_prefix}/policy", headers=AUTH)
        assert (legacy.status, twin.status) == (503, 503)
        assert await legacy.json() == await twin.json()
        run = run_id(settings, "n")
        assert (await client.post("/v1/runs", json=linear_run(run), headers=AUTH)).status == 201
        created = await client.get(f"/v1/runs/{run}/policy", headers=AUTH)
        assert (created.status, (await created.json())["reason"]) == (409, "not_started")
        # a spec written by something else is shown as absent, never a 500
        await redis.hset(Keys(run).run, "spec", b"\xff not json")
        shown = await client.get(f"/v1/runs/{run}", headers=AUTH)
        assert (shown.status, (await shown.json())["spec"]) == (200, None)
