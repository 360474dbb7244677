"""Claim check: the update's bytes in a directory store, the stream carrying only their address.

A publisher puts the update message (the same msgpack bytes as ever) in the store under its
SHA-256 and XADDs an entry with the content address (`o` = `sha256:<hex>`, shared/stream_entry.py)
and, when signed, the signature over those bytes. Redis then carries about a hundred bytes an
update, whatever the model's size. The aggregator fetches the objects of a whole read ahead of
deciding it, in a worker thread, and checks each against its address: an object that is missing
or whose bytes do not hash to it is a rejection with its reason (`claim_missing`,
`claim_mismatch`: a dead letter and `fedasync_aggregator_rejections_total{reason}`), exactly as
a malformed message is. `ledger verify` reads the same objects, so they must be kept as long as
the ledger (the store is the audit, as the archive is for in-stream payloads).

Two stores share one interface (`ClaimSource.fetch`), chosen by FEDASYNC_WIRE__CLAIM_CHECK_STORE:

- `dir`: a directory, which may be on a shared filesystem all publishers and the aggregator
  mount (FEDASYNC_WIRE__CLAIM_CHECK_DIR): objects under `<hex[:2]>/<hex>`, written to a
  temporary name, fsynced and renamed, so a reader sees a whole object or none;
- `redis`: one string per object, `claim:<run>:{<hex>}` (shared/keys.Keys.claim). The hash tag
  is the digest, so each object has its own slot and a run's large payloads spread over every
  primary of a cluster instead of loading its stream's one. A publisher SETs it (NX: an object
  is its bytes, the first copy is as good as any) before the XADD that names it; the aggregator
  reads a read's objects in one MGET (on a cluster `mget_nonatomic`: one MGET per node) and
  checks each against its address, as for the directory. Nothing here trusts Redis to hold the
  bytes it was given: a changed object is `claim_mismatch`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_cluster import is_cluster
from fedasync.shared.keys import Keys

PREFIX = "sha256:"


class ClaimError(ValueError):
    """An address that names no object here, or an object whose bytes do not match it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def address_of(message: bytes) -> str:
    """The content address of `message`."""
    return PREFIX + hashlib.sha256(message).hexdigest()


def digest_of(address: str) -> str | None:
    """The hex digest an address names; None if it is not a sha256 content address."""
    digest = address.removeprefix(PREFIX)
    if not address.startswith(PREFIX) or len(digest) != 64 or not _is_hex(digest):
        return None
    return digest


def _not_an_address(address: str) -> ClaimError:
    return ClaimError("claim_missing", f"{address[:80]!r} is not a sha256 content address")


def _checked(address: str, message: bytes) -> bytes | ClaimError:
    if address_of(message) != address:
        return ClaimError("claim_mismatch", f"the object stored as {address} has other bytes")
    return message


class ClaimSource(Protocol):
    """Where the aggregator and `ledger verify` read claim-check messages from."""

    async def fetch(self, addresses: Iterable[str]) -> dict[str, bytes | ClaimError]:
        """Each address's object, checked against it, or why not (missing, mismatched)."""
        ...


class ClaimStore:
    """A content-addressed directory of update messages."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, address: str) -> Path | None:
        digest = digest_of(address)
        return None if digest is None else self.root / digest[:2] / digest

    def put(self, message: bytes) -> str:
        """Store `message` durably (once: an object already there is the same bytes)."""
        address = address_of(message)
        path = self._path(address)
        assert path is not None
        if path.exists():
            return address
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        with partial.open("wb") as out:
            out.write(message)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
        return address

    def get(self, address: str) -> bytes:
        """The object at `address`, checked against it; ClaimError if missing or mismatched."""
        path = self._path(address)
        if path is None:
            raise _not_an_address(address)
        try:
            message = path.read_bytes()
        except FileNotFoundError:
            raise ClaimError("claim_missing", f"no object {address} in the store") from None
        checked = _checked(address, message)
        if isinstance(checked, ClaimError):
            raise checked
        return checked

    async def fetch(self, addresses: Iterable[str]) -> dict[str, bytes | ClaimError]:
        """`read_all` in a worker thread (hashing releases the GIL)."""
        return await asyncio.to_thread(self.read_all, list(addresses))

    def read_all(self, addresses: Iterable[str]) -> dict[str, bytes | ClaimError]:
        """Each address's object or its error (blocking)."""
        found: dict[str, bytes | ClaimError] = {}
        for address in addresses:
            try:
                found[address] = self.get(address)
            except ClaimError as exc:
                found[address] = exc
        return found


class RedisClaimStore:
    """Claim-check objects in Redis, one string each: `claim:<run>:{<hex>}`."""

    def __init__(self, redis: aioredis.Redis, run: str) -> None:
        self.redis = redis
        self.keys = Keys(run)

    def key_of(self, address: str) -> str | None:
        """The key of the object at `address`; None if it is not a content address."""
        digest = digest_of(address)
        return None if digest is None else self.keys.claim(digest)

    async def put(self, message: bytes, redis: aioredis.Redis | None = None) -> str:
        """SET the object, NX (an object already there is the same bytes, or is found to be
        other bytes when read: `claim_mismatch`); its address. Before the XADD that names it.
        `redis`: the connection to write on (a durable publisher's, so that its WAIT covers
        this write too)."""
        address = address_of(message)
        key = self.key_of(address)
        assert key is not None
        await (redis or self.redis).set(key, message, nx=True)
        return address

    async def fetch(self, addresses: Iterable[str]) -> dict[str, bytes | ClaimError]:
        """Every address's object in one MGET (one per node on a cluster), each checked."""
        wanted = list(dict.fromkeys(addresses))
        found: dict[str, bytes | ClaimError] = {}
        keyed: list[tuple[str, str]] = []
        for address in wanted:
            key = self.key_of(address)
            if key is None:
                found[address] = _not_an_address(address)
            else:
                keyed.append((address, key))
        if not keyed:
            return found
        keys = [key for _, key in keyed]
        values: Any
        if is_cluster(self.redis):
            values = await self.redis.mget_nonatomic(keys)  # type: ignore[attr-defined]
        else:
            values = await self.redis.mget(keys)
        for (address, _), value in zip(keyed, values, strict=True):
            if value is None:
                found[address] = ClaimError("claim_missing", f"no object {address} in Redis")
            else:
                found[address] = _checked(address, bytes(value))
        return found

    async def stored(self, count: int = 1000) -> list[str]:
        """The keys of this run's objects, for their retirement once the run's ledger is no
        longer kept: SCAN `claim:<run>:*` (redis-py's cluster client walks every primary)."""
        pattern = f"claim:{self.keys.prefix}:*"
        return [
            k.decode() if isinstance(k, bytes) else str(k)
            async for k in self.redis.scan_iter(match=pattern, count=count)
        ]


def claim_source(
    store: str, claim_dir: Path | None, redis: aioredis.Redis, run: str
) -> ClaimSource | None:
    """The claim-check store the settings choose (`FEDASYNC_WIRE__CLAIM_CHECK_STORE`): the
    directory (None without FEDASYNC_WIRE__CLAIM_CHECK_DIR: such entries are then refused as
    missing), or `run`'s objects in Redis."""
    if store == "redis":
        return RedisClaimStore(redis, run)
    return None if claim_dir is None else ClaimStore(claim_dir)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
