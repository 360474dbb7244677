"""Publishing an update: through the ingest service (signed), or straight to the stream.

An update is prepared once (`prepare`: its id, its bytes) and every attempt sends those same
bytes, so retries are one update: the ingest service adds an update id once and answers a retry
with the first entry id; on the stream, the aggregator's dedup memory records a second copy as a
duplicate and applies it at most once. Sending a prepared update again later (after `Unavailable`)
is just as safe.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from fedasync.client.errors import Refused, UnexpectedAnswer
from fedasync.client.redis_link import as_text, replicated
from fedasync.client.retry import retryable
from fedasync.client.transport import Answer, RedisRetry, Request, Transport, now_ms
from fedasync.shared import stream_entry
from fedasync.shared.device_auth import SigningKey, sign, update_domain
from fedasync.shared.durability import Durability
from fedasync.shared.ingest_protocol import signed_headers, updates_path
from fedasync.shared.keys import Keys
from fedasync.shared.snapshot_protocol import DONE_HEADER
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update


@dataclass(frozen=True, slots=True)
class PreparedUpdate:
    """An update ready to send: its id and its exact bytes (the wire format's message)."""

    update_id: str
    base_version: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Published:
    """Where the update is: its entry id in the updates stream. `retry` is True when the ingest
    service already had it (an earlier attempt whose answer was lost, or a send of the same
    prepared update again): the same entry, not a second one."""

    update_id: str
    entry_id: str
    retry: bool = False


def prepare(
    client_id: str,
    weights: np.ndarray,
    base_version: int,
    num_samples: int,
    metrics: Mapping[str, float] | None = None,
    *,
    update_id: str | None = None,
    dtype: str = "float32",
) -> PreparedUpdate:
    """Encode an update (a fresh random id unless given); WireError (a ValueError) if it is not
    one the services would accept: non-finite weights, a bad id, ..."""
    update = Update(
        update_id=update_id or uuid.uuid4().hex,
        client_id=client_id,
        base_version=base_version,
        num_samples=num_samples,
        weights=np.asarray(weights),
        created_at=time.time(),
        metrics=dict(metrics or {}),
    )
    return PreparedUpdate(update.update_id, base_version, encode_update(update, dtype))


def _again(answer: Answer) -> bool:
    """A 202 without an entry id (a proxy's answer) is asked again: the same update id makes
    ingest answer it as a retry."""
    return retryable(answer.status) or (answer.status == 202 and "entry_id" not in answer.json)


async def over_http(
    transport: Transport,
    base_url: str,
    key: SigningKey,
    client_id: str,
    update: PreparedUpdate,
    run: str | None = None,
) -> Published:
    """POST to the ingest service (`run`'s route, None: the legacy one), signed afresh on each
    attempt under the run's domain; Refused for a 4xx."""
    request = Request(
        "POST",
        base_url.rstrip("/") + updates_path(run),
        lambda: signed_headers(key, client_id, now_ms(), update.body, run),
        body=update.body,
    )
    answer = await transport.send("publish", request, _again)
    if answer.status != 202:
        raise Refused(answer.status, answer.reason, answer.error, answer.headers.get(DONE_HEADER))
    reply: dict[str, Any] = answer.json
    if reply.get("update_id", update.update_id) != update.update_id:
        raise UnexpectedAnswer(f"ingest answered for update {reply.get('update_id')!r}")
    return Published(update.update_id, str(reply["entry_id"]), bool(reply.get("retry", False)))


async def to_redis(
    redis: aioredis.Redis,
    keys: Keys,
    key: SigningKey | None,
    client_id: str,
    update: PreparedUpdate,
    retry: RedisRetry,
    durability: Durability | None = None,
    run: str | None = None,
) -> Published:
    """XADD the entry (signed if there is a key), retried with the same bytes on connection
    errors; never trims the stream (no MAXLEN). In durable mode the XADD counts only once the
    replicas hold it; short of them it is retried like a lost connection: the entry added
    again, which the aggregator's dedup memory records as a duplicate, never applies twice.
    `run` names the run in the signature's domain (None: the default run; `keys` are the run's
    keys either way)."""
    domain = update_domain(run)
    proof = None if key is None else sign(key, client_id, now_ms(), update.body, domain)
    fields = stream_entry.build(update.body, proof)

    async def xadd(client: aioredis.Redis) -> Any:
        return await client.xadd(keys.updates, fields)  # type: ignore[arg-type]

    durable = durability or Durability()
    entry_id = await retry("publish", lambda: replicated(redis, durable, xadd, key=keys.updates))
    return Published(update.update_id, as_text(entry_id))
