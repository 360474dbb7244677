"""Every HTTP service against the OpenAPI document it serves, with Schemathesis (issue 25, item 3).

The five services run as in production (their `run`, behind the connection guard) against one
real redis-server: the aggregator (its metrics port) with a model and a policy, the snapshot
service following it, ingest with a registered device, the evaluator following the snapshot
service, and control (with a token, reads closed: the default) on a key prefix of its own, so
that the policy changes it is sent (a pause, a budget) cannot turn the others' answers into the
503s they promise. Each service's document is read from its own `/openapi.json`; for each
operation Schemathesis generates bounded examples that fit the document (positive) and that do
not (negative), sends them over a real socket, and runs every built-in check on each answer: no
5xx, every status, content type, header and JSON body as documented, valid data accepted and
invalid data refused, auth not ignored. Control is run with the token and without it; ingest
unsigned (the generated headers) and signed (a device's real update as the body, its signature
over it; a receipt read signed by the device), once by a device holding an HMAC key and once
by one holding an Ed25519 key, whose 128-hex signatures the document describes too.

`-s` prints, per service, the operations, the examples sent and the checks run on each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from fedasync.services.aggregator.http import Readiness
from fedasync.services.aggregator.http import create_app as create_aggregator_app
from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.evaluator.service import create_app as create_evaluator_app
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.device_keys import ED25519, HMAC, add_device
from fedasync.shared.device_auth import SigningKey, parse_signing_key
from fedasync.shared.ingest_protocol import CONTENT_TYPE, read_headers, signed_headers
from fedasync.shared.keys import Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import initial_state, make_update
from tests.integration.test_slow_clients import TOKEN, configured, running

pytestmark = pytest.mark.integration
T = TypeVar("T")

#: examples per operation and generation mode: bounded, so the whole module costs little
EXAMPLES = 20
#: a device of each kind of key, by kind
DEVICES = {HMAC: "dev-a", ED25519: "dev-e"}

# the update body is bytes; Schemathesis sends it as it sends application/octet-stream
schemathesis.serializer.alias(CONTENT_TYPE, "application/octet-stream")
load_all_checks()
#: every built-in check (max_response_time is no built-in default: timing is bench/'s)
ALL_CHECKS = list(CHECKS.get_all())


@dataclass
class Stack:
    loop: asyncio.AbstractEventLoop
    urls: dict[str, str] = field(default_factory=dict)
    #: each device's signing key, by device id
    device_keys: dict[str, SigningKey] = field(default_factory=dict)

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)


def _settings(server: RedisServer, prefix: str) -> Settings:
    base = load_settings(
        redis={"url": server.url, "key_prefix": prefix, "socket_timeout_s": 5.0},
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100, "port": 0},
        snapshot={"long_poll_max_s": 0.05},  # a generated long-poll waits no longer
        ingest={"rate_per_s": 1e6, "burst": 1_000_000},
    )
    return configured(base)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stack = Stack(loop)
    exits = AsyncExitStack()

    async def start() -> None:
        cfg = _settings(redis_server, "t-openapi")
        redis = connect(cfg.redis)
        exits.push_async_callback(redis.aclose)
        keys = Keys(cfg.redis.key_prefix)
        for kind, device in DEVICES.items():
            stack.device_keys[device] = parse_signing_key(
                await add_device(redis, keys, device, kind)
            )
        ports = {}
        for name in ("aggregator", "snapshot", "ingest"):
            ports[name] = await exits.enter_async_context(running(name, cfg, redis))
        following = cfg.model_copy(
            update={
                "evaluator": cfg.evaluator.model_copy(
                    update={"snapshot_url": f"http://127.0.0.1:{ports['snapshot']}"}
                )
            }
        )
        ports["evaluator"] = await exits.enter_async_context(running("evaluator", following, redis))
        # control on its own prefix: its policy changes reach no other service here
        alone = _settings(redis_server, "t-openapi-control")
        control_redis = connect(alone.redis)
        exits.push_async_callback(control_redis.aclose)
        await run_aggregator(
            alone,
            redis=control_redis,
            initial=initial_state(alone),
            handle_signals=False,
            burst=True,
        )
        ports["control"] = await exits.enter_async_context(running("control", alone, control_redis))
        stack.urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    try:
        stack.call(start())
        yield stack
    finally:
        stack.call(exits.aclose())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@dataclass
class Figures:
    operations: list[str] = field(default_factory=list)
    examples: int = 0
    #: (operation, status) → answers: what the examples reached
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)


Prepare = Callable[[schemathesis.Case], dict[str, str]]


def no_headers(case: schemathesis.Case) -> dict[str, str]:
    return {}


Cases = Callable[[schemathesis.APIOperation, GenerationMode], st.SearchStrategy[schemathesis.Case]]


def generated(
    operation: schemathesis.APIOperation, mode: GenerationMode
) -> st.SearchStrategy[schemathesis.Case]:
    return operation.as_strategy(generation_mode=mode)


def conform(
    url: str,
    prepare: Prepare = no_headers,
    *,
    cases: Cases = generated,
    negative: bool = True,
    only: Callable[[schemathesis.APIOperation], bool] = lambda operation: True,
) -> Figures:
    """Every operation of the document `url` serves (Schemathesis leaves out /openapi.json
    itself, which it has just read), EXAMPLES positive and (with `negative`) EXAMPLES negative
    examples each, every built-in check on each answer; `prepare` may change a case and gives
    the headers to send with it, `cases` makes the cases, `only` picks the operations. Raises
    on the first failure (Hypothesis shrinks it first)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    figures = Figures()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        if not only(operation):
            continue
        figures.operations.append(operation.label)
        takes_input = bool(operation.path_parameters or operation.query or operation.headers)
        takes_input = takes_input or bool(list(operation.body))
        modes = [GenerationMode.POSITIVE]
        if negative and takes_input:  # nothing of an operation without input is invalid
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:

            @hypothesis_settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=cases(operation, mode))
            def check(case: schemathesis.Case) -> None:
                headers = prepare(case)
                figures.examples += 1
                response = case.call_and_validate(
                    base_url=url, session=session, headers=headers, checks=ALL_CHECKS
                )
                figures.statuses[(case.operation.label, response.status_code)] += 1

            check()
    session.close()
    return figures


def report(name: str, figures: Figures) -> None:
    print(
        f"\nschemathesis {name}: {len(figures.operations)} operations, {figures.examples} "
        f"examples, {len(ALL_CHECKS)} checks on each, 0 failures ({', '.join(figures.operations)})"
    )


@pytest.mark.parametrize("name", ["snapshot", "evaluator", "aggregator"])
def test_a_service_answers_as_its_openapi_document_says(stack: Stack, name: str) -> None:
    report(name, conform(stack.urls[name]))


def test_control_answers_as_its_document_says_with_and_without_the_token(stack: Stack) -> None:
    url = stack.urls["control"]
    with_token = conform(url, lambda case: {"Authorization": f"Bearer {TOKEN}"})
    without = conform(url)
    # the token was taken, and its absence refused (reads are closed by default)
    assert with_token.statuses[("GET /v1/policy", 200)] > 0
    assert with_token.statuses[("PATCH /v1/policy", 200)] > 0
    assert without.statuses[("GET /v1/policy", 401)] > 0
    assert without.statuses[("GET /v1/policy", 200)] == 0
    report("control", Figures(without.operations, with_token.examples + without.examples))


def run_cases(run: str) -> Cases:
    """The cases of a run route, all of them for `run` (generated ids name no run: a 404)."""

    def cases(
        operation: schemathesis.APIOperation, mode: GenerationMode
    ) -> st.SearchStrategy[schemathesis.Case]:
        return operation.as_strategy(generation_mode=mode, path_parameters={"run": run})

    return cases


def test_control_s_run_routes_answer_as_documented_for_a_run_that_exists(
    stack: Stack, redis_server: RedisServer
) -> None:
    """The runs routes (docs/http-api.md "Runs") on a run created through the API, with its
    aggregator started: every `/v1/runs/{run}/...` operation, positive, with the token (the
    generated ids of the test above only reach the 400 and 404 of an id that names no run)."""
    url, run = stack.urls["control"], "t-openapi-run"
    token = {"Authorization": f"Bearer {TOKEN}"}
    body = {"id": run, "task": {"name": "linear"}}
    created = requests.post(f"{url}/v1/runs", json=body, headers=token, timeout=30)
    assert created.status_code == 201, created.text

    async def start() -> None:
        cfg = _settings(redis_server, run)
        redis = connect(cfg.redis)
        try:
            await run_aggregator(
                cfg, redis=redis, initial=initial_state(cfg), handle_signals=False, burst=True
            )
        finally:
            await redis.aclose()

    stack.call(start())
    figures = conform(
        url,
        lambda case: token,
        cases=run_cases(run),
        negative=False,
        only=lambda operation: "{run}" in operation.path,
    )
    for route in ("", "/status", "/policy", "/policy/history", "/switches", "/evaluations"):
        assert figures.statuses[(f"GET /v1/runs/{{run}}{route}", 200)] > 0, route
    assert figures.statuses[("POST /v1/runs/{run}/stop", 200)] > 0
    report("control runs", figures)


def test_ingest_answers_as_its_document_says_signed_and_unsigned(stack: Stack) -> None:
    url = stack.urls["ingest"]
    unsigned = conform(url)
    assert unsigned.statuses[("POST /v1/updates", 202)] == 0
    assert unsigned.statuses[("POST /v1/updates", 401)] > 0
    examples = unsigned.examples
    for kind, device in DEVICES.items():
        # signed: the device's real requests, so positive only (the unsigned run sends
        # negatives); its updates were accepted, none refused for its signature
        signed = conform(
            url,
            device_signing(device, stack.device_keys[device]),
            cases=device_cases(device),
            negative=False,
        )
        assert signed.statuses[("POST /v1/updates", 202)] > 0, kind
        assert signed.statuses[("POST /v1/updates", 401)] == 0, kind
        examples += signed.examples
    report("ingest", Figures(unsigned.operations, examples))


def device_cases(device: str) -> Cases:
    """The device's cases: a POST's body is a real update of its own."""

    def cases(
        operation: schemathesis.APIOperation, mode: GenerationMode
    ) -> st.SearchStrategy[schemathesis.Case]:
        """A POST's body is a real update of the device's (a generated id: a repeat is a retry)."""
        if operation.method.upper() != "POST":
            return operation.as_strategy(generation_mode=mode)
        ids = st.text("0123456789abcdef", min_size=1, max_size=16)
        return ids.flatmap(
            lambda update_id: operation.as_strategy(
                generation_mode=mode,
                body=encode_update(make_update(update_id, 0, client=device)),
                media_type=CONTENT_TYPE,
            )
        )

    return cases


def device_signing(device: str, key: SigningKey) -> Prepare:
    def signed(case: schemathesis.Case) -> dict[str, str]:
        """The device's signature over the body (a POST), or over the receipt's update id."""
        now = int(time.time() * 1000)
        if case.method.upper() == "POST":
            return signed_headers(key, device, now, case.body)
        if "update_id" in (case.path_parameters or {}):
            return read_headers(key, device, now, str(case.path_parameters["update_id"]))
        return {}

    return signed


def documented_routes(app: web.Application) -> set[tuple[str, str]]:
    return {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def test_the_evaluator_s_and_the_aggregator_s_documents_name_every_route(
    stack: Stack,
) -> None:
    """As the other services' own tests do for theirs: nothing served goes undocumented."""
    cfg = load_settings(redis={"url": "redis://127.0.0.1:1"})
    redis = connect(cfg.redis)  # never used: the apps are only built
    apps = {
        "evaluator": create_evaluator_app(cfg, redis),
        "aggregator": create_aggregator_app(AggregatorMetrics(), Readiness(), redis),
    }
    for name, app in apps.items():
        document = requests.get(f"{stack.urls[name]}/openapi.json", timeout=30).json()
        operations = {(path, method) for path, ops in document["paths"].items() for method in ops}
        assert documented_routes(app) == operations, name
    stack.call(redis.aclose())
