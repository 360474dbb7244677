"""The models the snapshot service holds in memory, and the long-polls waiting for a new one.

The newest committed model is kept as ready-to-send bytes with its ETag; a request costs no Redis
round trip. A few older versions are kept too (they are immutable, so caching them is always
right). The cache learns of new versions by notification and wakes every long-poll waiting.

A cache can be frozen: once Redis reported a version below the newest one served, Redis's
numbers no longer name the models this service handed out, so the cache keeps what it holds and
takes nothing new until the service is restarted (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fedasync.shared.model_format import decode_model, summary, to_safetensors


@dataclass(slots=True)
class Served:
    """One committed version, ready to send."""

    version: int
    body: bytes
    sha256: str
    created_at: float
    meta: dict[str, Any]
    _safetensors: bytes | None = field(default=None, repr=False)

    @property
    def etag(self) -> str:
        """Strong: the bytes of a version never change."""
        return f'"v{self.version}-{self.sha256[:16]}"'

    def safetensors(self) -> bytes:
        if self._safetensors is None:
            self._safetensors = to_safetensors(decode_model(self.body, len(self.body)).snapshot)
        return self._safetensors

    @classmethod
    def from_bytes(cls, body: bytes) -> Served:
        message = decode_model(body, max_bytes=len(body))
        digest = hashlib.sha256(body).hexdigest()
        meta = summary(message) | {"sha256": digest, "size": len(body)}
        return cls(message.snapshot.version, body, digest, message.created_at, meta)


class TooManyWaiters(RuntimeError):
    """More long-polls than the configured cap; the client should retry later."""


class ModelCache:
    def __init__(self, keep: int, max_waiters: int) -> None:
        self.latest: Served | None = None
        self.done: dict[str, str] = {}
        self._older: OrderedDict[int, Served] = OrderedDict()
        self._keep = keep
        self._max_waiters = max_waiters
        self._changed = asyncio.Condition()
        self.waiters = 0
        self.closing = False
        #: why the cache takes no more versions (Redis moved back in time); None: following
        self.frozen: str | None = None

    def get(self, version: int) -> Served | None:
        if self.latest is not None and self.latest.version == version:
            return self.latest
        served = self._older.get(version)
        if served is not None:
            self._older.move_to_end(version)
        return served

    def remember(self, served: Served) -> None:
        """Keep an older version fetched on demand."""
        self._older[served.version] = served
        self._older.move_to_end(served.version)
        while len(self._older) > self._keep:
            self._older.popitem(last=False)

    def freeze(self, reason: str) -> None:
        """Keep what is held, take nothing new: no later publish changes what is served."""
        if self.frozen is None:
            self.frozen = reason

    async def publish(self, served: Served, done: dict[str, str]) -> None:
        """A newer committed version (or news of training being done): wake the waiters."""
        if self.frozen is not None:
            return
        async with self._changed:
            if self.latest is None or served.version > self.latest.version:
                if self.latest is not None:
                    self.remember(self.latest)
                self.latest = served
            self.done = done
            self._changed.notify_all()

    async def wait_newer(self, than: int, timeout: float) -> Served | None:
        """The latest version if newer than `than`, waiting up to `timeout`; None on timeout."""
        if self.latest is not None and self.latest.version > than:
            return self.latest
        if self.waiters >= self._max_waiters:
            raise TooManyWaiters(f"{self.waiters} long-polls already waiting")
        self.waiters += 1
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(
                        lambda: (
                            self.closing or (self.latest is not None and self.latest.version > than)
                        )
                    ),
                    timeout,
                )
        except TimeoutError:
            return None
        finally:
            self.waiters -= 1
        return None if self.closing else self.latest

    async def close(self) -> None:
        """Shutdown: every long-poll returns at once."""
        async with self._changed:
            self.closing = True
            self._changed.notify_all()
