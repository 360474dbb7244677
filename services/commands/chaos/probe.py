"""Reading the system's state after the faults: is the stream drained, what is served, committed.

Synchronous and read-only. Waiting is polling a condition with a deadline: the harness runs the
services as other processes, which offer no event it could await.
"""

from __future__ import annotations

import hashlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model

POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Backlog:
    """How far the aggregator is from done with the updates stream."""

    entries: int
    last_id: str
    delivered_up_to: str
    pending: int
    decisions: int
    dead_letters: int

    @property
    def drained(self) -> bool:
        """Every entry delivered, every delivered one acknowledged, each with its record."""
        return (
            self.pending == 0
            and self.delivered_up_to == self.last_id
            and self.decisions + self.dead_letters >= self.entries
        )


def backlog(client: redis.Redis, keys: Keys) -> Backlog:
    stream: Any = client.xinfo_stream(keys.updates)
    groups: Any = client.xinfo_groups(keys.updates)
    group = next(g for g in groups if _text(g["name"]) == AGGREGATOR_GROUP)
    return Backlog(
        entries=int(stream["length"]),
        last_id=_text(stream["last-generated-id"]),
        delivered_up_to=_text(group["last-delivered-id"]),
        pending=int(group["pending"]),
        decisions=int(client.xlen(keys.ledger)),
        dead_letters=int(client.xlen(keys.deadletter)),
    )


def wait_drained(
    client: redis.Redis, keys: Keys, timeout: float, tick: Callable[[], None]
) -> tuple[bool, Backlog]:
    """Poll until the stream is drained (or `timeout`); `tick` runs each round (restarts)."""
    deadline = time.monotonic() + timeout
    while True:
        tick()
        try:
            state = backlog(client, keys)
        except redis.ConnectionError:
            state = None
        if state is not None and state.drained:
            return True, state
        if time.monotonic() > deadline:
            return False, state or Backlog(0, "", "", -1, 0, 0)
        time.sleep(POLL_S)


@dataclass(frozen=True, slots=True)
class Served:
    """The latest model as the snapshot service sends it, and as Redis holds it."""

    served_version: int
    served_sha256: str
    committed_version: int
    committed_sha256: str

    @property
    def equal(self) -> bool:
        return (
            self.served_version == self.committed_version
            and self.served_sha256 == self.committed_sha256
        )


def committed(client: redis.Redis, keys: Keys) -> tuple[int, bytes]:
    version = int(client.get(keys.version) or 0)
    raw: Any = client.get(keys.model(version))
    return version, bytes(raw or b"")


def served_model(base_url: str) -> tuple[int, bytes] | None:
    try:
        with urllib.request.urlopen(base_url + "/v1/models/latest", timeout=5.0) as response:
            body = bytes(response.read())
    except (urllib.error.URLError, OSError):
        return None
    return decode_model(body, max_bytes=len(body)).snapshot.version, body


def wait_served(
    client: redis.Redis, keys: Keys, base_url: str, timeout: float, tick: Callable[[], None]
) -> Served:
    """Poll until the snapshot service serves the committed model, the same version and bytes
    (or `timeout`); `tick` runs each round (restarts).

    Not "served at least the committed version": after a failover that lost commits, a snapshot
    service frozen at a newer, lost version serves more than Redis holds until `tick` restarts it.
    """
    deadline = time.monotonic() + timeout
    while True:
        tick()
        version, raw = committed(client, keys)
        served = served_model(base_url)
        got = served or (-1, b"")
        result = Served(got[0], _sha(got[1]), version, _sha(raw))
        if result.equal or time.monotonic() > deadline:
            return result
        time.sleep(POLL_S)


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest() if raw else ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
