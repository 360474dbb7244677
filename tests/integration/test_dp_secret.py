"""The run's differential-privacy noise secret (services/stores/dp_secret.py) under the
generated ACL: made once by the aggregator, read by the aggregator and admin only, in nothing
else Redis holds, and what `fedasync ledger verify` does with it.

A private redis-server loads the generated ACL file plus a test-only `auditor`: the admin user's
rights without the grant on the secret, to show what a user that may not read it is told.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import VERIFY_NOT_CHECKED
from fedasync.services.commands.cli import main as cli
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.stores.acl import users
from fedasync.services.stores.dp_secret import SECRET_BYTES, SecretUnreadable
from fedasync.services.stores.ledger import verify
from fedasync.shared.keys import Keys
from tests.integration.helpers import (
    ACL_PREFIX,
    OBSERVER,
    acl_client,
    acl_url,
    acl_user_line,
    initial_state,
    ledger,
    make_update,
    publish,
)

pytestmark = pytest.mark.integration

KEYS = Keys(ACL_PREFIX)
AUDITOR = "auditor"
#: DP on from the start (a clip norm set); the rest of its fields at their defaults
DP = {"dp_clip": 1.0, "dp_noise": 1.0}


def auditor_line() -> str:
    """`admin` without the one grant on the noise secret."""
    admin = next(u for u in users(ACL_PREFIX) if u.name == "admin")
    selectors = tuple(g for g in admin.selectors if KEYS.dp_secret not in g.read)
    assert len(selectors) == len(admin.selectors) - 1, "admin has no grant on the secret"
    return acl_user_line(AUDITOR, dataclasses.replace(admin, selectors=selectors).rules())


@pytest.fixture
def acl_extra_users() -> tuple[str, ...]:
    """The auditor beside the generated users and the observer (`acl_server`)."""
    return (auditor_line(),)


def aggregator_settings(server: RedisServer, policy: dict[str, Any]) -> Settings:
    return load_settings(
        redis={
            "url": acl_url(server, "aggregator"),
            "key_prefix": ACL_PREFIX,
            "socket_timeout_s": 5.0,
        },
        task={"name": "linear"},
        aggregator={"batch_ms": 20, "block_ms": 100},
        policy=policy,
    )


async def train(server: RedisServer, policy: dict[str, Any], first: int, count: int) -> None:
    """`count` updates published (as the observer), decided by one aggregator start in burst
    mode, as the aggregator user."""
    settings = aggregator_settings(server, policy)
    observer = acl_client(server, OBSERVER)
    try:
        for i in range(first, first + count):
            await publish(observer, KEYS, make_update(f"u{i}", 0, 0.5 + i / 10, client=f"c{i % 3}"))
    finally:
        await observer.aclose()
    await run_aggregator(
        settings, initial=initial_state(settings), handle_signals=False, burst=True
    )


async def everything_but_the_secret(observer: aioredis.Redis) -> bytes:
    """Every key's DUMP but the secret's own: what the secret must not be found in."""
    parts = []
    for name in await observer.keys("*"):
        if name != KEYS.dp_secret.encode():
            parts.append(await observer.dump(name) or b"")
    return b"".join(parts)


@pytest.mark.asyncio
async def test_the_aggregator_makes_the_secret_once_and_only_it_and_admin_may_read_it(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await train(acl_server, DP, 0, 4)
    observer = acl_client(acl_server, OBSERVER)
    admin = acl_client(acl_server, "admin")
    others = {name: acl_client(acl_server, name) for name in ("control", "ingest", "worker")}
    try:
        secret = await admin.get(KEYS.dp_secret)
        assert isinstance(secret, bytes)
        assert len(secret) == SECRET_BYTES
        # a second start (a restart) reads the secret of the run, never makes another
        await train(acl_server, DP, 4, 3)
        assert await admin.get(KEYS.dp_secret) == secret
        assert len(await ledger(observer, KEYS)) == 7
        # in nothing else Redis holds (ledger, state, genesis, models, policies, ...), nor the log
        assert secret not in await everything_but_the_secret(observer)
        assert caplog.records, "nothing was logged: the check below would say nothing"
        for shown in (secret.hex(), repr(secret), secret.decode("latin-1")):
            assert shown not in caplog.text
        for client in others.values():
            with pytest.raises(NoPermissionError):
                await client.get(KEYS.dp_secret)
        report = await verify(admin, KEYS, 1 << 24)  # `fedasync ledger verify`, as admin
        assert report.ok, report.describe()
        assert report.replayed == 7
    finally:
        for client in (observer, admin, *others.values()):
            await client.aclose()


@pytest.mark.asyncio
async def test_a_secret_given_with_the_initial_state_is_the_runs_when_it_has_none(
    acl_server: RedisServer,
) -> None:
    """The simulator's secret (derived from its seed), given with the initial state, becomes the
    run's: a test can replay the simulator through the aggregator bit for bit."""
    settings = aggregator_settings(acl_server, DP)
    chosen = bytes(range(SECRET_BYTES))
    initial = initial_state(settings)
    initial.dp_secret = chosen
    await run_aggregator(settings, initial=initial, handle_signals=False, burst=True)
    admin = acl_client(acl_server, "admin")
    try:
        assert await admin.get(KEYS.dp_secret) == chosen
    finally:
        await admin.aclose()


def test_verify_of_a_dp_run_as_a_user_without_the_secret_says_why_and_exits_3(
    acl_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(train(acl_server, DP, 0, 4))
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FEDASYNC_REDIS__URL", acl_url(acl_server, AUDITOR))
    assert cli(["ledger", "verify"]) == VERIFY_NOT_CHECKED
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "ledger verify: policy version 0 turns differential privacy on" in err
    assert KEYS.dp_secret in err
    assert "run it as admin" in err

    async def as_auditor() -> None:
        auditor = acl_client(acl_server, AUDITOR)
        try:
            with pytest.raises(SecretUnreadable, match="only the aggregator and admin"):
                await verify(auditor, KEYS, 1 << 24)
        finally:
            await auditor.aclose()

    asyncio.run(as_auditor())
    monkeypatch.setenv("FEDASYNC_REDIS__URL", acl_url(acl_server, "admin"))
    assert cli(["ledger", "verify"]) == 0
    assert "ledger verify: OK" in capsys.readouterr().out


@pytest.mark.asyncio
async def test_verify_of_a_run_without_dp_never_reads_the_secret(acl_server: RedisServer) -> None:
    """DP off in every policy version: the replay needs no secret, so a user that may not read
    it verifies all the same, and Redis logs no refusal."""
    await train(acl_server, {}, 0, 4)
    auditor = acl_client(acl_server, AUDITOR)
    admin = acl_client(acl_server, "admin")
    try:
        report = await verify(auditor, KEYS, 1 << 24)
        assert report.ok, report.describe()
        assert await admin.acl_log() == []
    finally:
        await auditor.aclose()
        await admin.aclose()
