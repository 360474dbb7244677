"""Device keys in Redis: add, revoke, list (for `fedasync devices`) and a short-lived cache.

Keys live in the hash `{p}:device-keys` (client id → 64 hex for an HMAC key, which is the device's
secret itself, or `ed25519:<base64 public key>` for an Ed25519 device, whose private key is printed
once by `add_device` and never stored). Revoking removes the key and notes
the time in `{p}:device-revoked`, so a later refusal can say `revoked` rather than
`unknown_device`. Adding a key for a revoked client id lifts the revocation.

The aggregator and the ingest service look keys up through `KeyCache`: a key found is trusted for
at most `refresh_s` seconds before it is read again, and a key *not* found is never cached. So a
key added takes effect at the next update from that device, and a revocation takes effect for
every update checked more than `refresh_s` after it, without a restart. Ingest closes even that
gap: each key comes with the fingerprint of its stored text (`Known`), and ingest's script adds an
entry only if the key stored *at that instant* still has it, so a key rotated or revoked while an
update was arriving is never used to accept it (services/ingest/store.py).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.shared.device_auth import (
    KEY_BYTES,
    AuthError,
    AuthReason,
    VerifyKey,
    ed25519_texts,
    parse_verify_key,
)
from fedasync.shared.keys import Keys

#: The kinds of key `add_device` can issue.
HMAC = "hmac"
ED25519 = "ed25519"
KINDS = (ED25519, HMAC)


def new_key() -> str:
    """A fresh device key (32 random bytes from the OS), as the 64 hex characters a device holds."""
    return secrets.token_hex(KEY_BYTES)


async def add_device(redis: aioredis.Redis, keys: Keys, client_id: str, kind: str = HMAC) -> str:
    """Give `client_id` a new key (replacing any old one) and return it; shown once, never again.

    HMAC: the key returned is the one stored. Ed25519: the private key is returned and only its
    public key is stored, so whoever reads Redis still cannot sign as the device.
    """
    if kind == HMAC:
        key = stored = new_key()
    elif kind == ED25519:
        key, stored = ed25519_texts(secrets.token_bytes(KEY_BYTES))
    else:
        raise ValueError(f"a key kind is one of {', '.join(KINDS)}, got {kind!r}")
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.device_keys, client_id, stored)
        pipe.hdel(keys.device_revoked, client_id)
        await pipe.execute()
    return key


async def revoke_device(redis: aioredis.Redis, keys: Keys, client_id: str) -> bool:
    """Remove the key of `client_id`; False if it had none."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.device_keys, client_id)
        pipe.hset(keys.device_revoked, client_id, str(int(time.time() * 1000)))
        removed, _ = await pipe.execute()
    return bool(removed)


async def list_devices(redis: aioredis.Redis, keys: Keys) -> dict[str, str]:
    """Client id → "active" or "revoked"; the keys themselves are never listed."""
    active: Any = await redis.hkeys(keys.device_keys)
    revoked: Any = await redis.hkeys(keys.device_revoked)
    out = {c.decode(): "revoked" for c in revoked}
    out.update({c.decode(): "active" for c in active})
    return dict(sorted(out.items()))


def fingerprint(stored: str) -> str:
    """SHA-1 hex of a key's text as stored in Redis: what ingest's script compares with Lua's
    `redis.sha1hex` of the stored value, so the key itself (an HMAC secret) never travels as a
    script argument, which SLOWLOG or MONITOR would show."""
    return hashlib.sha1(stored.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Known:
    """A device's key as loaded, with the fingerprint of its stored text."""

    key: VerifyKey
    fingerprint: str


@dataclass(slots=True)
class _Entry:
    known: Known
    read_at: float


class KeyCache:
    """Device keys, read from Redis in one round trip per batch and trusted for `refresh_s`."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._redis = redis
        self._keys = keys
        self._refresh_s = refresh_s
        self._known: dict[str, _Entry] = {}
        self._revoked: set[str] = set()

    async def load(self, client_ids: set[str]) -> None:
        """Re-read the keys of these clients unless read less than `refresh_s` ago."""
        now = self._clock()
        wanted = sorted(
            c
            for c in client_ids
            if c not in self._known or now - self._known[c].read_at >= self._refresh_s
        )
        if not wanted:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._keys.device_keys, wanted)
            pipe.hmget(self._keys.device_revoked, wanted)
            found, revoked = await pipe.execute()
        for client_id, key, gone in zip(wanted, found, revoked, strict=True):
            if gone is not None:
                self._revoked.add(client_id)
            else:
                self._revoked.discard(client_id)
            if key is None:
                self._known.pop(client_id, None)  # a miss is never cached
                continue
            try:
                text = key.decode()
                self._known[client_id] = _Entry(
                    Known(parse_verify_key(text), fingerprint(text)), now
                )
            except (ValueError, UnicodeDecodeError):
                self._known.pop(client_id, None)  # a corrupt key is as good as none

    def key_of(self, client_id: str) -> VerifyKey:
        """The key loaded for `client_id`, or AuthError(UNKNOWN_DEVICE / REVOKED)."""
        return self.known_of(client_id).key

    def known_of(self, client_id: str) -> Known:
        """`key_of`, with the stored text's fingerprint."""
        entry = self._known.get(client_id)
        if entry is not None:
            return entry.known
        if client_id in self._revoked:
            raise AuthError(AuthReason.REVOKED, f"the key of {client_id!r} was revoked")
        raise AuthError(AuthReason.UNKNOWN_DEVICE, f"no key for client {client_id!r}")

    async def get(self, client_id: str) -> VerifyKey:
        """`load` one client, then `key_of` it."""
        return (await self.get_known(client_id)).key

    async def get_known(self, client_id: str) -> Known:
        """`load` one client, then `known_of` it."""
        await self.load({client_id})
        return self.known_of(client_id)

    def forget(self, client_id: str) -> None:
        """Drop the key cached for `client_id`: the next lookup reads Redis (a key seen to have
        changed)."""
        self._known.pop(client_id, None)
