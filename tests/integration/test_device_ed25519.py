"""Ed25519 device keys against a real Redis and the real ingest service over HTTP.

A device holding an Ed25519 private key publishes through ingest and its update is decided; its
receipt is read with a signed GET; a forged or altered signature is refused with the same typed
reasons as an HMAC one; an HMAC device keeps working beside it; and after `fedasync devices add`
nothing in Redis holds the private key (issue 27 item 6: Redis read access no longer forges).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis as sync_redis
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.ingest.app import create_app
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.device_keys import ED25519, HMAC, add_device, revoke_device
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import parse_key, parse_signing_key, sign
from fedasync.shared.ingest_protocol import (
    PATH,
    SIGNATURE_HEADER,
    read_headers,
    receipt_path,
    signed_headers,
)
from fedasync.shared.keys import Keys
from fedasync.shared.wire import encode_update
from tests.integration.helpers import dead_letters, initial_state, ledger, make_update
from tests.integration.helpers import ingest_refusals as refusals

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return int(time.time() * 1000)


def secured(settings: Settings) -> Settings:
    auth = settings.auth.model_copy(update={"required": True, "window_s": 300.0})
    ingest = settings.ingest.model_copy(update={"rate_per_s": 1000.0, "burst": 1000})
    return settings.model_copy(update={"auth": auth, "ingest": ingest})


@pytest_asyncio.fixture
async def client(settings: Settings, redis: aioredis.Redis) -> AsyncIterator[TestClient[Any, Any]]:
    client = TestClient(TestServer(create_app(secured(settings), redis)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def flip_last_hex(signature: str) -> str:
    return signature[:-1] + ("0" if signature[-1] != "0" else "1")


@pytest.mark.asyncio
async def test_an_ed25519_device_publishes_through_ingest_is_decided_and_reads_its_receipt(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    text = await add_device(redis, keys, "dev-ed", ED25519)
    assert text.startswith("ed25519:")
    key = parse_signing_key(text)
    hmac_key = parse_key(await add_device(redis, keys, "dev-mac", HMAC))

    body = encode_update(make_update("ed-1", 0, client="dev-ed"))
    headers = signed_headers(key, "dev-ed", now_ms(), body)
    assert len(headers[SIGNATURE_HEADER]) == 128  # an Ed25519 signature, 64 bytes
    response = await client.post(PATH, data=body, headers=headers)
    assert response.status == 202, await response.json()
    # an HMAC device still publishes beside it
    mac_body = encode_update(make_update("mac-1", 0, client="dev-mac"))
    response = await client.post(
        PATH, data=mac_body, headers=signed_headers(hmac_key, "dev-mac", now_ms(), mac_body)
    )
    assert response.status == 202, await response.json()

    await run_aggregator(
        secured(settings),
        redis=redis,
        initial=initial_state(settings),
        handle_signals=False,
        burst=True,
    )
    decided = {e["update_id"]: e["outcome"] for e in await ledger(redis, keys)}
    assert decided == {"ed-1": "applied", "mac-1": "applied"}

    receipt = await client.get(
        receipt_path("ed-1"), headers=read_headers(key, "dev-ed", now_ms(), "ed-1")
    )
    answer = await receipt.json()
    assert receipt.status == 200, answer
    assert answer["outcome"] == "applied"
    # a read signature never passes as another id's, nor an update signature as a read
    for wrong in (
        read_headers(key, "dev-ed", now_ms(), "ed-2"),
        signed_headers(key, "dev-ed", now_ms(), b""),
    ):
        refused = await client.get(receipt_path("ed-1"), headers=wrong)
        assert (refused.status, (await refused.json())["reason"]) == (401, "bad_signature")


@pytest.mark.asyncio
async def test_forged_or_altered_ed25519_signatures_are_refused_with_the_hmac_reasons(
    client: TestClient[Any, Any], settings: Settings, redis: aioredis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    key = parse_signing_key(await add_device(redis, keys, "dev-ed", ED25519))
    other = parse_signing_key(await add_device(redis, keys, "dev-other", ED25519))
    hmac_key = parse_key(await add_device(redis, keys, "dev-mac", HMAC))
    body = encode_update(make_update("ed-1", 0, client="dev-ed"))

    altered = signed_headers(key, "dev-ed", now_ms(), body)
    altered[SIGNATURE_HEADER] = flip_last_hex(altered[SIGNATURE_HEADER])
    cases: list[tuple[str, dict[str, str], bytes]] = [
        ("bad_signature", altered, body),
        ("bad_signature", signed_headers(other, "dev-ed", now_ms(), body), body),  # another key
        ("bad_signature", signed_headers(key, "dev-ed", now_ms(), body), body + b"x"),  # body
        ("bad_signature", signed_headers(hmac_key, "dev-ed", now_ms(), body), body),  # HMAC
        ("signature_expired", signed_headers(key, "dev-ed", now_ms() - 3_600_000, body), body),
        ("unknown_device", signed_headers(key, "dev-x", now_ms(), body), body),
    ]
    for reason, headers, sent in cases:
        response = await client.post(PATH, data=sent, headers=headers)
        assert (response.status, (await response.json())["reason"]) == (401, reason)
    # an Ed25519 signature against an HMAC device's key is refused too, not mistaken for one
    mac_body = encode_update(make_update("mac-1", 0, client="dev-mac"))
    response = await client.post(
        PATH, data=mac_body, headers=signed_headers(key, "dev-mac", now_ms(), mac_body)
    )
    assert (response.status, (await response.json())["reason"]) == (401, "bad_signature")
    assert refusals(client, "bad_signature") == 5
    assert await redis.xlen(keys.updates) == 0


@pytest.mark.asyncio
async def test_the_aggregator_verifies_ed25519_entries_written_straight_to_redis(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """A device on a trusted network XADDs its signed entry itself: the aggregator checks it
    with the public key, and dead-letters a forgery under the same reason as an HMAC one."""
    settings = secured(settings)
    keys = Keys(settings.redis.key_prefix)
    key = parse_signing_key(await add_device(redis, keys, "dev-ed", ED25519))
    other = parse_signing_key(await add_device(redis, keys, "dev-other", ED25519))
    seconds, micros = await redis.time()
    at = int(seconds) * 1000 + int(micros) // 1000
    for update_id, signing in (("good", key), ("forged", other)):
        raw = encode_update(make_update(update_id, 0, client="dev-ed"))
        fields: Any = stream_entry.build(raw, sign(signing, "dev-ed", at, raw))
        await redis.xadd(keys.updates, fields)
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    assert [(e["update_id"], e["outcome"]) for e in await ledger(redis, keys)] == [
        ("good", "applied")
    ]
    assert [d[b"reason"] for d in await dead_letters(redis, keys)] == [b"bad_signature"]


def everything_stored(url: str) -> bytes:
    """Every key of the server, each as DUMP and as its plain content, joined."""
    client = sync_redis.Redis.from_url(url)
    try:
        parts: list[bytes] = []
        for name in client.scan_iter("*"):
            parts.append(name)
            dumped: Any = client.dump(name)
            parts.append(dumped or b"")
            kind = client.type(name)
            if kind == b"hash":
                stored: Any = client.hgetall(name)
                for field, value in stored.items():
                    parts += [field, value]
            elif kind == b"string":
                parts.append(client.get(name) or b"")  # type: ignore[arg-type]
        return b"\n".join(parts)
    finally:
        client.close()


def test_devices_add_prints_an_ed25519_key_that_redis_never_holds(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["devices", "add", "phone-ed"]) == 0  # ed25519 is the default kind
    private_text = capsys.readouterr().out.strip()
    assert private_text.startswith("ed25519:")
    seed = base64.b64decode(private_text.removeprefix("ed25519:"))
    assert len(seed) == 32
    assert main(["devices", "add", "--kind", "hmac", "phone-mac"]) == 0
    hmac_text = capsys.readouterr().out.strip()
    assert len(hmac_text) == 64

    stored = everything_stored(redis_url)
    device_keys = Keys(load_settings().redis.key_prefix).device_keys.encode()
    assert device_keys in stored  # the dump did see the keys' hash
    assert hmac_text.encode() in stored  # an HMAC key is its secret: stored as it is
    for form in (seed, private_text.encode(), private_text.removeprefix("ed25519:").encode()):
        assert form not in stored
    assert seed.hex().encode() not in stored


@pytest.mark.asyncio
async def test_a_key_rotated_or_revoked_while_ingest_caches_the_old_one_accepts_nothing_more(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """Ingest trusts a cached key for a minute here, yet nothing signed with the old key is
    added after the rotation: its script checks the stored key at the XADD. The refusal says
    why with the key of now, and the new key is taken at once."""
    settings = secured(settings)
    settings = settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"key_refresh_s": 60.0})}
    )
    keys = Keys(settings.redis.key_prefix)
    old = parse_key(await add_device(redis, keys, "dev-1", HMAC))
    client = TestClient(TestServer(create_app(settings, redis)))
    await client.start_server()
    try:

        async def post(key: Any, update_id: str) -> tuple[int, dict[str, Any]]:
            body = encode_update(make_update(update_id, 0, client="dev-1"))
            headers = signed_headers(key, "dev-1", now_ms(), body)
            response = await client.post(PATH, data=body, headers=headers)
            return response.status, await response.json()

        assert (await post(old, "u1"))[0] == 202  # the old key is now cached
        new = parse_signing_key(await add_device(redis, keys, "dev-1", ED25519))
        status, answer = await post(old, "u2")
        assert (status, answer["reason"]) == (401, "bad_signature")
        assert "changed while its update arrived" in answer["error"]
        assert (await post(new, "u3"))[0] == 202  # the refusal dropped the cached key
        await revoke_device(redis, keys, "dev-1")
        status, answer = await post(new, "u4")
        assert (status, answer["reason"]) == (401, "revoked")
    finally:
        await client.close()
    entries: Any = await redis.xrange(keys.updates)
    assert len(entries) == 2  # u1 and u3
