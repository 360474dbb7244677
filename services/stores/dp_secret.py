"""The run's differential-privacy noise secret in Redis: made once, read by whom it is for.

The core draws each server step's Gaussian noise from a generator keyed by HMAC-SHA256 of this
secret and the step (shared/privacy/), so the noise is reproducible by whoever holds the secret
(the aggregator after a restart, `fedasync ledger verify` run as admin) and by nobody else: a
reader of the ledger or of a model cannot subtract it. It lives in `{p}:dp-secret` only: never in
the ledger, a checkpoint, the genesis, a status route or a log (docs/security.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from fedasync.services.runtime.redis_conn import get_bytes, replicated
from fedasync.shared.durability import Durability
from fedasync.shared.keys import Keys
from fedasync.shared.policy import Policy

#: bytes of a secret: a full HMAC-SHA256 key
SECRET_BYTES = 32


class SecretUnreadable(Exception):
    """A DP run's noise secret cannot be read (this Redis user may not, or it is gone): the
    replay cannot reproduce the noise. The message says which, and what to do."""


async def ensure_secret(
    redis: aioredis.Redis, keys: Keys, durability: Durability, proposed: bytes | None = None
) -> tuple[bytes, bool]:
    """The run's secret, and whether this call made it: `proposed` (else 32 fresh random
    bytes) if the run has none yet, else the one it has. SET NX, so every start of every
    aggregator of a run reads the same secret, and a SET that reaches Redis late (after its
    retry) changes nothing. In durable mode it is on the replicas before any noise is drawn from
    it (a failover must not hand the run a new one): a secret found already there is written
    again, the same bytes, so that the WAIT covers it even when the start that made it gave up
    waiting."""
    fresh = proposed if proposed is not None else os.urandom(SECRET_BYTES)
    if len(fresh) != SECRET_BYTES:
        raise ValueError(f"a noise secret is {SECRET_BYTES} bytes, not {len(fresh)}")

    async def write(client: aioredis.Redis) -> tuple[bytes | None, bool]:
        if await client.set(keys.dp_secret, fresh, nx=True):
            return fresh, True
        stored = await get_bytes(client, keys.dp_secret)
        if durability.replicas and stored is not None:
            await client.set(keys.dp_secret, stored, xx=True)
        return stored, False

    stored, made = await replicated(redis, durability, write, key=keys.dp_secret)
    if stored is None or len(stored) != SECRET_BYTES:
        raise RuntimeError(f"{keys.dp_secret} is not a {SECRET_BYTES}-byte secret")
    return stored, made


def uses_dp(policies: Iterable[Policy]) -> Policy | None:
    """The first of `policies` with differential privacy on (a clip norm set), or None."""
    return next((p for p in policies if p.dp_clip is not None), None)


async def read_secret(redis: aioredis.Redis, keys: Keys, because: Policy) -> bytes:
    """The secret a replay of a DP run needs (`because` is the policy that turned DP on), or
    SecretUnreadable saying why not: never a traceback."""
    try:
        secret = await get_bytes(redis, keys.dp_secret)
    except NoPermissionError:
        raise SecretUnreadable(
            f"policy version {because.version} turns differential privacy on, and this Redis "
            f"user may not read the run's noise secret ({keys.dp_secret}): only the aggregator "
            "and admin users may; run it as admin to reproduce the noise"
        ) from None
    if secret is None:
        raise SecretUnreadable(
            f"policy version {because.version} turns differential privacy on, and the run's "
            f"noise secret ({keys.dp_secret}) is gone: its noise cannot be reproduced"
        )
    return secret
