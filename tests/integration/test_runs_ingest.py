"""Ingest and devices per run: the real ingest app and the real aggregator on a real Redis.

Two runs, A and B, beside the deployment's default run (the test's own key prefix). A device
enrolled in A is `unknown_device` in B, at ingest and at the aggregator; and where A's key was
copied into B's key table for the same client id, a body signed for A and replayed to B is
`bad_signature`, because each run signs under its own domain (shared/device_auth.update_domain).
An update id is once per run, not once per deployment; receipts are per run; a run's pause
touches that run only; the legacy routes are the default run's, as before.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.client import DeviceClient, Refused
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.ingest.app import INGEST, RUN_INGESTS, create_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import add_device
from fedasync.services.stores.policy_store import change_policy, ensure_policy
from fedasync.services.stores.runs import create_run
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import DOMAIN, parse_key, sign, update_domain
from fedasync.shared.ingest_protocol import (
    CONTENT_TYPE,
    PATH,
    read_headers,
    receipt_path,
    signed_headers,
    updates_path,
)
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy
from fedasync.shared.runs import RunSpec
from fedasync.shared.wire import encode_update
from tests.integration.helpers import dead_letters, initial_state, ledger, make_update

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CLIENT = "dev-a"
#: `post`'s default: signed for the run whose route it goes to
SAME = "=same"


def now_ms() -> int:
    return int(time.time() * 1000)


def body_of(update_id: str, client: str = CLIENT) -> bytes:
    return encode_update(make_update(update_id, 0, client=client))


def ingest_settings(settings: Settings, **ingest: Any) -> Settings:
    section = settings.ingest.model_copy(
        update={"max_body_bytes": 4096, "rate_per_s": 1000.0, "burst": 1000} | ingest
    )
    return settings.model_copy(update={"ingest": section})


def of_run(settings: Settings, run: str) -> Settings:
    """The settings of run `run`'s own processes (its aggregator): its id as key prefix, and
    the deployment's default run named, so that it signs and verifies as a named run."""
    return settings.model_copy(
        update={
            "redis": settings.redis.model_copy(update={"key_prefix": run}),
            "auth": settings.auth.model_copy(
                update={"default_run": settings.redis.key_prefix, "required": True}
            ),
        }
    )


@dataclasses.dataclass
class Runs:
    a: str
    b: str


@pytest_asyncio.fixture
async def runs(redis: aioredis.Redis) -> Runs:
    tag = uuid.uuid4().hex[:10]
    made = Runs(f"ra-{tag}", f"rb-{tag}")
    for run in (made.a, made.b):
        assert await create_run(redis, RunSpec(run))
    return made


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient[Any, Any]]:
    client = TestClient(TestServer(create_app(ingest_settings(settings), redis)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def post(
    client: TestClient[Any, Any],
    run: str | None,
    key: bytes,
    body: bytes,
    signed_for: str | None = SAME,
) -> tuple[int, dict[str, Any]]:
    """POST `body` to `run`'s route, signed for `signed_for` (by default: that same run)."""
    domain_run = run if signed_for == SAME else signed_for
    headers = signed_headers(key, CLIENT, now_ms(), body, domain_run)
    answer = await client.post(updates_path(run), data=body, headers=headers)
    return answer.status, await answer.json()


async def copy_key(redis: aioredis.Redis, source: str, target: str, client_id: str) -> None:
    """Put the key `source` holds for `client_id` into `target`'s table: the same key in both."""
    stored = await redis.hget(Keys(source).device_keys, client_id)
    assert stored is not None
    await redis.hset(Keys(target).device_keys, client_id, stored)


async def test_a_device_enrolled_in_a_run_is_refused_for_another(
    client: TestClient[Any, Any], redis: aioredis.Redis, runs: Runs
) -> None:
    key_a = parse_key(await add_device(redis, Keys(runs.a), CLIENT))
    body = body_of("u-1")

    # not enrolled in B: unknown there, however it signs
    assert reason_of(await post(client, runs.b, key_a, body)) == (401, "unknown_device")
    assert reason_of(await post(client, runs.b, key_a, body, runs.a)) == (401, "unknown_device")
    assert await redis.xlen(Keys(runs.b).updates) == 0

    # A's key copied into B's table: the key is known there now, but a body signed for A,
    # replayed to B's route, does not verify under B's domain
    await copy_key(redis, runs.a, runs.b, CLIENT)
    assert reason_of(await post(client, runs.b, key_a, body, runs.a)) == (401, "bad_signature")
    assert await redis.xlen(Keys(runs.b).updates) == 0
    # ... while the same key signing for B is taken (it is the domain that refused above)
    status, reply = await post(client, runs.b, key_a, body)
    assert (status, reply["retry"]) == (202, False)
    # and A takes what was signed for A
    status, reply = await post(client, runs.a, key_a, body)
    assert (status, reply["retry"]) == (202, False)
    assert await redis.xlen(Keys(runs.a).updates) == 1


def reason_of(answer: tuple[int, dict[str, Any]]) -> tuple[int, Any]:
    """An answer's status and reason (a refusal's human detail is not compared)."""
    return answer[0], answer[1].get("reason")


async def test_the_aggregator_refuses_another_runs_device_and_another_runs_signature(
    settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    """Straight into B's stream (a publisher with Redis rights): A's device is unknown to B's
    aggregator, and with A's key copied into B, an entry signed for A is bad_signature."""
    key_a = parse_key(await add_device(redis, Keys(runs.a), CLIENT))
    keys_b = Keys(runs.b)
    stranger = encode_update(make_update("s-1", 0, client="dev-s"))
    key_s = parse_key(await add_device(redis, Keys(runs.a), "dev-s"))
    await redis.xadd(
        keys_b.updates,
        stream_entry.build(  # type: ignore[arg-type]
            stranger, sign(key_s, "dev-s", now_ms(), stranger, update_domain(runs.b))
        ),
    )
    await copy_key(redis, runs.a, runs.b, CLIENT)
    for update_id, signed_for in (("r-1", runs.a), ("r-2", runs.b)):
        body = body_of(update_id)
        proof = sign(key_a, CLIENT, now_ms(), body, update_domain(signed_for))
        await redis.xadd(keys_b.updates, stream_entry.build(body, proof))  # type: ignore[arg-type]

    run_b = of_run(settings, runs.b)
    await run_aggregator(
        run_b, redis=redis, initial=initial_state(run_b), handle_signals=False, burst=True
    )

    reasons = [d[b"reason"] for d in await dead_letters(redis, keys_b)]
    assert reasons == [b"unknown_device", b"bad_signature"]
    decided = [(r["update_id"], r["outcome"]) for r in await ledger(redis, keys_b)]
    assert decided == [("r-2", "applied")]


async def test_an_update_id_is_once_per_run_and_receipts_are_per_run(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    key_a = parse_key(await add_device(redis, Keys(runs.a), CLIENT))
    key_b = parse_key(await add_device(redis, Keys(runs.b), CLIENT))
    assert key_a != key_b  # a distinct key per run
    body = body_of("same-id")

    status_a, first_a = await post(client, runs.a, key_a, body)
    status_b, first_b = await post(client, runs.b, key_b, body)
    assert (status_a, first_a["retry"], status_b, first_b["retry"]) == (202, False, 202, False)
    # a retry is the same entry, in its own run only
    status, again = await post(client, runs.a, key_a, body)
    assert (status, again["retry"], again["entry_id"]) == (202, True, first_a["entry_id"])
    assert [await redis.xlen(Keys(r).updates) for r in (runs.a, runs.b)] == [1, 1]
    assert await redis.xlen(Keys(settings.redis.key_prefix).updates) == 0

    run_a = of_run(settings, runs.a)
    await run_aggregator(
        run_a, redis=redis, initial=initial_state(run_a), handle_signals=False, burst=True
    )

    async def receipt(run: str, key: bytes, signed_for: str) -> tuple[int, dict[str, Any]]:
        headers = read_headers(key, CLIENT, now_ms(), "same-id", signed_for)
        answer = await client.get(receipt_path("same-id", run), headers=headers)
        return answer.status, await answer.json()

    status, record = await receipt(runs.a, key_a, runs.a)
    assert (status, record["outcome"], record["update_id"]) == (200, "applied", "same-id")
    # B's update of the same id is B's: not decided there (B's aggregator has not run)
    assert reason_of(await receipt(runs.b, key_b, runs.b)) == (404, "not_decided")
    # a read signed for A, with A's key copied into B, is not a read of B's receipt
    await copy_key(redis, runs.a, runs.b, CLIENT)
    assert reason_of(await receipt(runs.b, key_a, runs.a)) == (401, "bad_signature")


async def test_the_legacy_routes_are_the_default_runs_as_before(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    default = Keys(settings.redis.key_prefix)
    key = parse_key(await add_device(redis, default, CLIENT))
    body = body_of("legacy-1")
    assert update_domain(None) == DOMAIN  # the default run signs as every device always did
    assert reason_of(await post(client, None, key, body, runs.a)) == (401, "bad_signature")
    answer = await client.post(PATH, data=body, headers=signed_headers(key, CLIENT, now_ms(), body))
    reply = await answer.json()
    assert (answer.status, reply["status"], reply["retry"]) == (202, "accepted", False)
    assert await redis.xlen(default.updates) == 1
    assert [await redis.xlen(Keys(r).updates) for r in (runs.a, runs.b)] == [0, 0]
    # the default run's key is not a key of any other run
    assert reason_of(await post(client, runs.a, key, body)) == (401, "unknown_device")
    # the default run by its id is the same run, signing as on the legacy route
    status, again = await post(client, settings.redis.key_prefix, key, body, None)
    assert (status, again["retry"], again["entry_id"]) == (202, True, reply["entry_id"])
    assert await redis.xlen(default.updates) == 1


async def test_a_devices_rate_is_its_own_in_each_run(
    settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    """The token bucket is per (run, client id): the same name in another run has its own."""
    limited = ingest_settings(settings, rate_per_s=0.001, burst=1)
    client = TestClient(TestServer(create_app(limited, redis)))
    await client.start_server()
    try:
        key_a = parse_key(await add_device(redis, Keys(runs.a), CLIENT))
        key_b = parse_key(await add_device(redis, Keys(runs.b), CLIENT))
        status, _ = await post(client, runs.a, key_a, body_of("q-1"))
        assert status == 202
        assert reason_of(await post(client, runs.a, key_a, body_of("q-2"))) == (
            429,
            "rate_limited",
        )
        status, _ = await post(client, runs.b, key_b, body_of("q-1"))
        assert status == 202
    finally:
        await client.close()


async def test_a_run_that_is_not_served_is_refused_before_its_body(
    settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    limited = ingest_settings(settings, max_runs=2)  # the default run and one more
    client = TestClient(TestServer(create_app(limited, redis)))
    await client.start_server()
    try:
        key_a = parse_key(await add_device(redis, Keys(runs.a), CLIENT))
        key_b = parse_key(await add_device(redis, Keys(runs.b), CLIENT))
        body = body_of("m-1")
        headers = {"Content-Type": CONTENT_TYPE}
        unknown = await client.post("/v1/runs/no-such-run/updates", data=body, headers=headers)
        assert (unknown.status, (await unknown.json())["reason"]) == (404, "unknown_run")
        bad = await client.post("/v1/runs/Not_A_Run/updates", data=body, headers=headers)
        assert (bad.status, (await bad.json())["reason"]) == (400, "bad_run_id")
        # Expect: 100-continue is answered before the body too, for a run that is not there
        early = await client.post(
            "/v1/runs/no-such-run/updates",
            data=body,
            headers={**headers, "Expect": "100-continue"},
        )
        assert (early.status, (await early.json())["reason"]) == (404, "unknown_run")

        status, _ = await post(client, runs.a, key_a, body)
        assert status == 202
        status, refused = await post(client, runs.b, key_b, body)
        assert (status, refused["reason"]) == (503, "too_many_runs")
        registry = client.app[INGEST].metrics.registry
        assert registry.get_sample_value("fedasync_ingest_runs_refused_total") == 1
        assert registry.get_sample_value("fedasync_ingest_runs") == 2
        assert await redis.xlen(Keys(runs.b).updates) == 0

        # A retired: its place is given up to B (the cached "A exists" forgotten, as it is
        # after its few seconds)
        await redis.delete(Keys(runs.a).run)
        client.app[RUN_INGESTS].known.forget(runs.a)
        status, taken = await post(client, runs.b, key_b, body)
        assert (status, taken["retry"]) == (202, False)
        assert registry.get_sample_value("fedasync_ingest_runs") == 2
    finally:
        await client.close()


async def test_a_runs_pause_pauses_that_run_only(
    settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    client = TestClient(
        TestServer(create_app(ingest_settings(settings, policy_refresh_s=0.0), redis))
    )
    await client.start_server()
    try:
        keys_a = Keys(runs.a)
        in_force = await ensure_policy(redis, keys_a, Policy())
        paused = dataclasses.replace(in_force, ingest_paused=True, version=in_force.version + 1)
        await change_policy(redis, keys_a, paused, who="test", why="pause A", at=time.time())
        key_a = parse_key(await add_device(redis, keys_a, CLIENT))
        key_b = parse_key(await add_device(redis, Keys(runs.b), CLIENT))
        body = body_of("p-1")
        status, refused = await post(client, runs.a, key_a, body)
        assert (status, refused["reason"]) == (503, "ingest_paused")
        status, taken = await post(client, runs.b, key_b, body)
        assert (status, taken["retry"]) == (202, False)
        assert [await redis.xlen(Keys(r).updates) for r in (runs.a, runs.b)] == [0, 1]
    finally:
        await client.close()


async def test_the_device_client_publishes_and_reads_receipts_of_its_run(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    key_b = await add_device(redis, Keys(runs.b), CLIENT)
    ingest_url = str(client.make_url(""))
    async with DeviceClient(
        "http://127.0.0.1:9", CLIENT, key=key_b, ingest_url=ingest_url, run=runs.b
    ) as device:
        sent = await device.publish(
            make_update("c-1", 0, client=CLIENT).weights, 0, 10, update_id="c-1"
        )
        assert not sent.retry
        assert await redis.xlen(Keys(runs.b).updates) == 1
        assert not (await device.receipt(sent.update_id)).decided

        run_b = of_run(settings, runs.b)
        await run_aggregator(
            run_b, redis=redis, initial=initial_state(run_b), handle_signals=False, burst=True
        )
        receipt = await device.receipt(sent.update_id)
        assert (receipt.decided, receipt.outcome) == (True, "applied")

    # straight to Redis, for run B, signed under B's domain: B's aggregator takes it
    async with DeviceClient(
        "http://127.0.0.1:9", CLIENT, key=key_b, redis=redis, run=runs.b
    ) as direct:
        sent = await direct.publish(
            make_update("c-2", 1, client=CLIENT).weights, 1, 10, update_id="c-2"
        )
    run_b = of_run(settings, runs.b)
    await run_aggregator(
        run_b, redis=redis, initial=initial_state(run_b), handle_signals=False, burst=True
    )
    decided = {r["update_id"]: r["outcome"] for r in await ledger(redis, Keys(runs.b))}
    assert decided == {"c-1": "applied", "c-2": "applied"}
    assert await dead_letters(redis, Keys(runs.b)) == []


async def test_a_run_that_finished_takes_no_new_update_and_still_answers_a_retry(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis, runs: Runs
) -> None:
    keys_a = Keys(runs.a)
    key_a = await add_device(redis, keys_a, CLIENT)
    key_b = parse_key(await add_device(redis, Keys(runs.b), CLIENT))
    taken_body = body_of("d-1")
    status, taken = await post(client, runs.a, parse_key(key_a), taken_body)
    assert (status, taken["retry"]) == (202, False)

    # A is stopped and its aggregator closes it: the update taken before is decided (dropped,
    # closed), and the done flag is set by the final commit
    run_a = of_run(settings, runs.a)
    in_force = await ensure_policy(redis, keys_a, Policy())
    stopped = dataclasses.replace(in_force, stopped=True, version=in_force.version + 1)
    await change_policy(redis, keys_a, stopped, who="test", why="stop A", at=time.time())
    await run_aggregator(
        run_a, redis=redis, initial=initial_state(run_a), handle_signals=False, burst=True
    )
    assert await redis.hget(keys_a.done, "reason") == b"stopped"
    assert {r["update_id"]: r["reason"] for r in await ledger(redis, keys_a)} == {"d-1": "closed"}
    assert await redis.xlen(keys_a.updates) == 1

    # a retry of the update taken before is answered with its entry; a new one is refused
    status, retried = await post(client, runs.a, parse_key(key_a), taken_body)
    assert (status, retried["retry"], retried["entry_id"]) == (202, True, taken["entry_id"])
    assert reason_of(await post(client, runs.a, parse_key(key_a), body_of("d-2"))) == (
        409,
        "run_done",
    )
    assert await redis.xlen(keys_a.updates) == 1
    # the device client hears it as the end of training, as from the snapshot service
    async with DeviceClient(
        "http://127.0.0.1:9", CLIENT, key=key_a, ingest_url=str(client.make_url("")), run=runs.a
    ) as device:
        with pytest.raises(Refused) as refused:
            await device.publish(make_update("d-3", 0, client=CLIENT).weights, 0, 10)
        assert refused.value.reason == "run_done"
        assert refused.value.training_done == device.training_done == "stopped"
    registry = client.app[INGEST].metrics.registry
    assert registry.get_sample_value("fedasync_ingest_refusals_total", {"reason": "run_done"}) == 2
    # B is not done: it takes the same body
    status, taken_b = await post(client, runs.b, key_b, body_of("d-2"))
    assert (status, taken_b["retry"]) == (202, False)
