"""The device client (fedasync.client) against the real snapshot, ingest and aggregator services.

Models (ETag, 304, the long-poll woken by a commit), publishing through ingest and straight to
Redis, receipts equal to the ledger's decisions, a receipt asked before and after its decision,
a device that cannot read another device's receipt, a publish whose reply is lost, and the
blocking client. Every service is the real app on the linear task, in this process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web

from fedasync.client import (
    DeviceClient,
    Outcome,
    PreparedUpdate,
    Receipt,
    RetryPolicy,
    SyncDeviceClient,
)
from fedasync.learning.tasks import get_task
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.ingest.service import run as run_ingest
from fedasync.services.runtime.settings import Settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.device_keys import ED25519, HMAC, add_device
from fedasync.services.stores.ledger import verify
from fedasync.shared.device_auth import parse_key
from fedasync.shared.ingest_protocol import (
    CONTENT_TYPE,
    PATH,
    read_headers,
    receipt_path,
    signed_headers,
)
from fedasync.shared.keys import Keys
from tests.integration.helpers import ledger

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SIZE = get_task("linear").layout.size
TAU_MAX = 2
WAIT = 60.0  # generous: a decision normally takes a few tens of milliseconds


def weights(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(size).astype(np.float32)


@dataclass
class System:
    """Snapshot and ingest serving, the aggregator started on demand; all stopped together."""

    settings: Settings
    redis: aioredis.Redis
    snapshot_url: str = ""
    ingest_url: str = ""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    aggregator_started: bool = False

    def start(self, service: Coroutine[Any, Any, Any]) -> None:
        self.tasks.append(asyncio.create_task(service))

    def start_aggregator(self) -> None:
        self.aggregator_started = True
        self.start(
            run_aggregator(
                self.settings, redis=self.redis, handle_signals=False, stopping=self.stopping
            )
        )

    async def serving(self, awaitable: Coroutine[Any, Any, Any]) -> Any:
        """Await `awaitable`, failing at once with a service's error if one stops meanwhile."""
        main = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait([main, *self.tasks], return_when="FIRST_COMPLETED")
        if main in done:
            return main.result()
        main.cancel()
        for task in done:
            task.result()
        raise AssertionError("a service stopped early")

    def device(self, client_id: str, **options: Any) -> DeviceClient:
        """A device publishing through ingest with its own key (unless told otherwise)."""
        if "redis" not in options:
            options = {"key": self.keys[client_id], "ingest_url": self.ingest_url} | options
        return DeviceClient(
            self.snapshot_url,
            client_id,
            key_prefix=self.settings.redis.key_prefix,
            **options,
        )


@pytest_asyncio.fixture
async def system(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[System]:
    settings = settings.model_copy(
        update={
            "snapshot": settings.snapshot.model_copy(update={"port": 0}),
            "ingest": settings.ingest.model_copy(
                update={"port": 0, "rate_per_s": 1000.0, "burst": 1000}
            ),
            "policy": settings.policy.model_copy(update={"tau_max": TAU_MAX}),
        }
    )
    out = System(settings, redis)
    prefix = Keys(settings.redis.key_prefix)
    for name in ("device-a", "device-b"):
        out.keys[name] = await add_device(redis, prefix, name)
    loop = asyncio.get_running_loop()
    snapshot_port: asyncio.Future[int] = loop.create_future()
    ingest_port: asyncio.Future[int] = loop.create_future()
    common = {"redis": redis, "handle_signals": False, "stopping": out.stopping}
    out.start(run_snapshot(settings, started=snapshot_port, **common))
    out.start(run_ingest(settings, started=ingest_port, **common))
    out.snapshot_url = f"http://127.0.0.1:{await snapshot_port}"
    out.ingest_url = f"http://127.0.0.1:{await ingest_port}"
    try:
        yield out
    finally:
        await settle(out)
        out.stopping.set()
        await asyncio.gather(*out.tasks)


async def settle(system: System) -> None:
    """Before stopping: let the snapshot service hold a model, so its follower is past its first
    pub/sub read. Stopped within that read, it would not stop (redis-py swallows the
    cancellation; a snapshot service bug this test does not cover)."""
    if not system.aggregator_started:
        system.start_aggregator()
    url = system.snapshot_url + "/v1/models/latest"
    params = {"newer_than": "-1", "wait": str(WAIT)}
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as response:
        await response.read()


def as_record(receipt: Receipt) -> dict[str, Any]:
    """A receipt written back as the ledger record it was read from."""
    assert receipt.decision is not None
    return receipt.decision.to_dict() | {
        "stream_id": receipt.stream_id,
        "at": receipt.decided_at,
        "ledger_id": receipt.ledger_id,
    }


# ------------------------------------------------------------------------------------- models
async def test_latest_downloads_once_then_an_unchanged_model_costs_a_304(system: System) -> None:
    system.start_aggregator()
    async with system.device("device-a") as device:
        first = await system.serving(device.wait_newer(-1, WAIT))  # the genesis commit
        assert first is not None
        assert first.version == 0
        again = await system.serving(device.latest())
        assert again is first  # 304: the model held is returned, not downloaded again
        assert (device.downloads.downloads, device.downloads.not_modified) == (1, 1)
        assert first.etag is not None
        assert first.etag.startswith('"v0-')
        assert not first.weights.flags.writeable  # held for 304s: train on a copy
        assert device.training_done is None


async def test_latest_is_none_before_the_first_commit(system: System) -> None:
    async with system.device("device-a") as device:
        assert await system.serving(device.latest()) is None  # no aggregator: nothing committed
        assert await system.serving(device.wait_newer(-1, 0.0)) is None


async def test_wait_newer_wakes_on_a_commit(system: System) -> None:
    system.start_aggregator()
    async with system.device("device-a") as device, system.device("device-b") as other:
        model = await system.serving(device.wait_newer(-1, WAIT))
        assert model is not None
        assert model.version == 0
        waiting = asyncio.create_task(device.wait_newer(0, WAIT))
        await system.serving(other.publish(weights(1), base_version=0, num_samples=10))
        newer = await system.serving(waiting)
        assert newer is not None
        assert newer.version == 1
        assert device.model is newer


# ----------------------------------------------------------------------------------- receipts
async def test_receipts_equal_the_ledger_decisions_through_ingest_and_straight_to_redis(
    system: System,
) -> None:
    """Device a publishes through ingest, device b straight to Redis (unsigned: trusted
    network); applied, dropped (stale) and rejected updates each get the ledger's decision."""
    system.start_aggregator()
    over_ingest = system.device("device-a")
    over_redis = system.device("device-b", redis=system.redis)
    plan: list[tuple[DeviceClient, np.ndarray, int]] = [
        (over_ingest, weights(1), 0),  # applied, τ 0 → version 1
        (over_redis, weights(2), 1),  # applied, τ 0 → version 2
        (over_ingest, weights(3), 1),  # applied, τ 1 → version 3
        (over_redis, weights(4), 0),  # τ 3 > τ_max 2: dropped as stale
        (over_ingest, weights(5, SIZE + 1), 3),  # wrong size: rejected
        (over_redis, weights(6), 99),  # a base version from the future: rejected
    ]
    receipts: list[Receipt] = []
    async with over_ingest, over_redis:
        for device, vector, base in plan:
            sent = await system.serving(device.publish(vector, base, num_samples=10))
            receipts.append(await system.serving(device.receipt(sent.update_id, wait=WAIT)))
    decisions = {d["update_id"]: d for d in await ledger(system.redis, Keys(prefix(system)))}
    assert len(decisions) == len(plan)
    assert [as_record(r) for r in receipts] == [decisions[r.update_id] for r in receipts]
    applied = [(r.outcome, r.decision.tau, r.decision.version) for r in receipts[:3]]  # type: ignore[union-attr]
    assert applied == [(Outcome.APPLIED, 0, 1), (Outcome.APPLIED, 0, 2), (Outcome.APPLIED, 1, 3)]
    assert receipts[0].decision is not None
    assert receipts[0].decision.alpha == pytest.approx(0.6)
    others = [(r.outcome, r.decision.reason) for r in receipts[3:]]  # type: ignore[union-attr]
    assert others == [
        (Outcome.DROPPED, "stale"),
        (Outcome.REJECTED, "shape_mismatch"),
        (Outcome.REJECTED, "future_base_version"),
    ]
    report = await verify(system.redis, Keys(prefix(system)), 1 << 24)
    assert report.ok, report.describe()
    assert report.receipts == len(plan)


async def test_a_device_with_an_ed25519_key_publishes_and_reads_its_receipt(
    system: System,
) -> None:
    """The key as `fedasync devices add` prints it by default (`ed25519:<base64>`), handed to
    DeviceClient as it is: the update is applied and its receipt read through ingest."""
    system.keys["device-ed"] = await add_device(
        system.redis, Keys(prefix(system)), "device-ed", ED25519
    )
    system.start_aggregator()
    async with system.device("device-ed") as device:
        sent = await system.serving(device.publish(weights(1), 0, num_samples=10))
        receipt = await system.serving(device.receipt(sent.update_id, wait=WAIT))
    assert receipt.outcome is Outcome.APPLIED


async def test_a_receipt_before_the_decision_is_not_decided_and_waiting_gives_it(
    system: System,
) -> None:
    async with system.device("device-a") as device:
        sent = await system.serving(device.publish(weights(1), base_version=0, num_samples=10))
        early = await system.serving(device.receipt(sent.update_id))
        assert not early.decided  # accepted by ingest, but no aggregator runs yet
        assert (early.outcome, early.decision, early.ledger_id) == (None, None, None)
        system.start_aggregator()
        late = await system.serving(device.receipt(sent.update_id, wait=WAIT))
    assert late.decided
    assert late.outcome is Outcome.APPLIED
    assert late.decision is not None
    assert (late.decision.tau, late.decision.version) == (0, 1)
    assert late.stream_id == sent.entry_id


async def test_a_device_cannot_read_another_devices_receipt(system: System) -> None:
    system.start_aggregator()
    async with system.device("device-a") as owner, system.device("device-b") as other:
        sent = await system.serving(owner.publish(weights(1), base_version=0, num_samples=10))
        mine = await system.serving(owner.receipt(sent.update_id, wait=WAIT))
        assert mine.outcome is Outcome.APPLIED  # decided: there is a receipt to steal
        theirs = await system.serving(other.receipt(sent.update_id))
        assert not theirs.decided
    key_a, key_b = parse_key(system.keys["device-a"]), parse_key(system.keys["device-b"])

    async def get(update_id: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        url = system.ingest_url + receipt_path(update_id)
        async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
            return r.status, json.loads(await r.read())

    now = now_ms()
    # device b, signing correctly, asks for a's update id: the answer of an id nobody used
    stolen = await get(sent.update_id, read_headers(key_b, "device-b", now, sent.update_id))
    unused = await get("never-used", read_headers(key_b, "device-b", now, "never-used"))
    assert stolen[0] == unused[0] == 404
    assert stolen[1]["reason"] == unused[1]["reason"] == "not_decided"
    assert stolen[1]["error"].replace(sent.update_id, "X") == unused[1]["error"].replace(
        "never-used", "X"
    )
    # b claiming to be a, with its own key: refused before any lookup
    forged = await get(sent.update_id, read_headers(key_b, "device-a", now, sent.update_id))
    assert (forged[0], forged[1]["reason"]) == (401, "bad_signature")
    # the owner, for comparison
    own = await get(sent.update_id, read_headers(key_a, "device-a", now, sent.update_id))
    assert own[0] == 200
    assert own[1]["ledger_id"] == mine.ledger_id


async def test_a_receipt_signature_cannot_be_replayed_as_an_update(system: System) -> None:
    key = parse_key(system.keys["device-a"])
    async with system.device("device-a") as device:
        update = device.prepare(weights(1), base_version=0, num_samples=10)
    now = now_ms()
    # a signature made for reading, over the very bytes of the update, under the read domain
    read = read_headers(key, "device-a", now, "u")
    from fedasync.shared.device_auth import READ_DOMAIN, sign

    proof = sign(key, "device-a", now, update.body, READ_DOMAIN)
    replayed = read | {"Content-Type": CONTENT_TYPE, "X-Fedasync-Signature": proof.mac.hex()}
    async with aiohttp.ClientSession() as session:
        url = system.ingest_url + PATH
        async with session.post(url, data=update.body, headers=replayed) as r:
            assert (r.status, (await r.json())["reason"]) == (401, "bad_signature")
        genuine = signed_headers(key, "device-a", now, update.body)
        async with session.post(url, data=update.body, headers=genuine) as r:
            assert r.status == 202  # the same bytes, signed as an update, are accepted


def now_ms() -> int:
    import time

    return int(time.time() * 1000)


def prefix(system: System) -> str:
    return system.settings.redis.key_prefix


# --------------------------------------------------------------------------- a lost reply
@dataclass
class LosingProxy:
    """Forwards POST /v1/updates to ingest; the reply to the first one never reaches the device
    (the connection is closed instead). Records what ingest answered each time."""

    ingest_url: str
    answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-fedasync")}
        headers["Content-Type"] = request.headers["Content-Type"]
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.ingest_url + PATH, data=body, headers=headers) as upstream,
        ):
            status, answer = upstream.status, await upstream.json()
        self.answers.append((status, answer))
        if len(self.answers) == 1:
            assert request.transport is not None
            request.transport.close()  # ingest added it; the device never hears so
            raise asyncio.CancelledError  # nothing is written back
        return web.json_response(answer, status=status)


async def test_a_publish_retried_after_a_lost_reply_keeps_its_update_id_and_gets_one_decision(
    system: System,
) -> None:
    proxy = LosingProxy(system.ingest_url)
    app = web.Application()
    app.router.add_post(PATH, proxy.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    proxy.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    try:
        system.start_aggregator()
        device = system.device("device-a", ingest_url=proxy.url, sleep=record)
        async with device, system.device("device-a") as direct:
            update = device.prepare(weights(1), base_version=0, num_samples=10)
            sent = await system.serving(device.send(update))
            receipt = await system.serving(direct.receipt(update.update_id, wait=WAIT))
    finally:
        await runner.cleanup()
    # the fault happened: ingest accepted the first POST, whose answer was lost and retried
    assert len(proxy.answers) == 2
    assert len(waits) == 1
    (first_status, first), (second_status, second) = proxy.answers
    assert (first_status, first["retry"]) == (202, False)
    assert (second_status, second["retry"]) == (202, True)
    # the outcome: one update id, one entry, one decision
    assert sent.update_id == update.update_id == first["update_id"] == second["update_id"]
    assert sent.entry_id == first["entry_id"]
    assert sent.retry
    keys = Keys(prefix(system))
    assert await system.redis.xlen(keys.updates) == 1
    decisions = [d for d in await ledger(system.redis, keys) if d["update_id"] == sent.update_id]
    assert len(decisions) == 1
    assert receipt.outcome is Outcome.APPLIED
    assert as_record(receipt) == decisions[0]


# ------------------------------------------------------------------------- the docs' curl
HTTP_API = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def signed_curl_snippets() -> list[str]:
    """The shell snippets under docs/http-api.md's "A signed `curl`", as written: Ed25519 first,
    then HMAC."""
    text = HTTP_API.read_text().split("### A signed `curl`", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in text.split("```sh\n")[1:]]


@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
)
@pytest.mark.parametrize(("kind", "snippet"), [(ED25519, 0), (HMAC, 1)])
async def test_the_signed_curl_examples_in_the_http_docs_work(
    system: System, kind: str, snippet: int
) -> None:
    client_id = f"device-{kind}"
    system.keys[client_id] = await add_device(system.redis, Keys(prefix(system)), client_id, kind)
    assert system.keys[client_id].startswith("ed25519:") == (kind == ED25519)
    system.start_aggregator()
    async with system.device(client_id) as device:
        sent = await system.serving(device.publish(weights(1), base_version=0, num_samples=10))
        receipt = await system.serving(device.receipt(sent.update_id, wait=WAIT))
    values = {
        "KEY": system.keys[client_id],
        "CLIENT": client_id,
        "UPDATE": sent.update_id,
        "INGEST": system.ingest_url,
    }
    lines = signed_curl_snippets()[snippet].splitlines()
    for i, line in enumerate(lines):  # the example's four values, replaced by this system's
        name = line.split("=", 1)[0]
        if name in values:
            lines[i] = f"{name}={values.pop(name)}"
    assert values == {}, "the snippet no longer sets KEY, CLIENT, UPDATE and INGEST"
    shell = await asyncio.create_subprocess_exec(
        "sh", "-c", "\n".join(lines), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await system.serving(shell.communicate())
    assert shell.returncode == 0
    assert json.loads(out) == as_record(receipt)


# ------------------------------------------------------------------------------------- sync
async def test_the_blocking_client_fetches_publishes_and_reads_its_receipt(
    system: System,
) -> None:
    system.start_aggregator()

    def device_script() -> tuple[int, str, Receipt]:
        with SyncDeviceClient(
            system.snapshot_url,
            "device-a",
            key=system.keys["device-a"],
            ingest_url=system.ingest_url,
            retry=RetryPolicy(attempts=3),
        ) as device:
            model = device.wait_newer(-1, WAIT)
            assert model is not None
            trained = model.weights.copy() + 0.1
            sent = device.publish(trained, model.version, num_samples=10)
            return model.version, sent.update_id, device.receipt(sent.update_id, wait=WAIT)

    version, update_id, receipt = await system.serving(asyncio.to_thread(device_script))
    assert version == 0
    assert receipt.update_id == update_id
    assert receipt.outcome is Outcome.APPLIED


async def test_an_update_id_with_a_slash_is_one_path_segment(system: System) -> None:
    system.start_aggregator()
    async with system.device("device-a") as device:
        update = device.prepare(weights(1), 0, 10, update_id="run 7/step 3")
        await system.serving(device.send(update))
        receipt = await system.serving(device.receipt("run 7/step 3", wait=WAIT))
    assert receipt.outcome is Outcome.APPLIED


async def test_prepared_updates_keep_their_bytes(system: System) -> None:
    """Sending the same prepared update twice is one update: ingest answers the first entry."""
    async with system.device("device-a") as device:
        update = device.prepare(weights(1), 0, 10)
        first = await system.serving(device.send(update))
        again = await system.serving(device.send(PreparedUpdate(**vars_of(update))))
    assert (again.entry_id, again.retry, first.retry) == (first.entry_id, True, False)


def vars_of(update: PreparedUpdate) -> dict[str, Any]:
    return {"update_id": update.update_id, "base_version": update.base_version, "body": update.body}
