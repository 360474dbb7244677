"""Reading the system's state after the faults: is the stream drained, what is served, committed.

Synchronous and read-only. Waiting is polling a condition with a deadline: the harness runs the
services as other processes, which offer no event it could await.
"""

from __future__ import annotations

import hashlib
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model
from fedasync.shared.snapshot_protocol import LATEST_PATH

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
    #: Redis's own XINFO GROUPS figure (None: it cannot tell)
    lag: int | None = None

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
        lag=None if group.get("lag") is None else int(group["lag"]),
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


def served_model(base_url: str, path: str = LATEST_PATH) -> tuple[int, bytes] | None:
    """The newest model the snapshot service at `base_url` serves at `path` (a named run's:
    snapshot_protocol.latest_path(run)); None if it does not answer."""
    try:
        with urllib.request.urlopen(base_url + path, timeout=5.0) as response:
            body = bytes(response.read())
    except (urllib.error.URLError, OSError):
        return None
    return decode_model(body, max_bytes=len(body)).snapshot.version, body


def wait_served(
    client: redis.Redis,
    keys: Keys,
    base_url: str,
    timeout: float,
    tick: Callable[[], None],
    path: str = LATEST_PATH,
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
        served = served_model(base_url, path)
        got = served or (-1, b"")
        result = Served(got[0], _sha(got[1]), version, _sha(raw))
        if result.equal or time.monotonic() > deadline:
            return result
        time.sleep(POLL_S)


#: the aggregator's gauge of entries not yet read (services/aggregator/metrics.py)
LAG_METRIC = "fedasync_aggregator_lag"
#: what the aggregator logs each time it puts Redis's drifted entries-read right
LAG_CORRECTED = re.compile(r"Redis reported a lag of (\d+) with every entry read")


@dataclass(frozen=True, slots=True)
class LagAtRest:
    """The lag once the stream is drained: what the aggregator reports (its metric, which the
    control status and the rules read the same way), what Redis's XINFO GROUPS says, and each
    drifted figure the aggregator corrected during the run (issue 25: Redis 7.0's lag drifts
    across restarts, and was taken as it was)."""

    metric: float | None
    redis: int | None
    corrected: tuple[int, ...]


def metric_samples(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]] | None:
    """Each sample of `name` on a service's /metrics: (its labels, its value); None if the
    service does not answer."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5.0) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return [
        (dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def aggregator_lag(metrics_url: str) -> float | None:
    """The aggregator's lag gauge from its /metrics; None if it does not answer."""
    samples = metric_samples(metrics_url, LAG_METRIC)
    return samples[0][1] if samples else None


def wait_lag_at_rest(
    client: redis.Redis,
    keys: Keys,
    metrics_url: str,
    logs: list[Path],
    timeout: float,
    tick: Callable[[], None],
) -> LagAtRest:
    """Poll the drained system until the aggregator reports a lag of 0 (or `timeout`: the last
    figure read); `tick` runs each round (restarts). The aggregator refreshes its gauge about
    once a second at rest, so a figure from before the drain is gone within a few polls."""
    deadline = time.monotonic() + timeout
    while True:
        tick()
        metric = aggregator_lag(metrics_url)
        if metric == 0 or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    try:
        in_redis = backlog(client, keys).lag
    except (redis.RedisError, StopIteration):  # Redis away, or no group to read
        in_redis = None
    corrected = tuple(
        int(found.group(1))
        for path in logs
        if path.exists()
        for found in LAG_CORRECTED.finditer(path.read_text(errors="replace"))
    )
    return LagAtRest(metric, in_redis, corrected)


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest() if raw else ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
