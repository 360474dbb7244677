"""Receipts: what the aggregator decided about one of this device's updates.

A receipt is the ledger record of the update's first decision: applied (with τ, α and the new
version), dropped (with its reason: stale, closed, ...), rejected (with its reason), or duplicate;
or nothing yet. Read through the ingest service (`GET /v1/updates/{update_id}`, signed with the
device key) or, on a trusted network, straight from Redis's receipts index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import redis.asyncio as aioredis

from fedasync.client.errors import Refused, UnexpectedAnswer
from fedasync.client.receipt_index import lookup
from fedasync.client.transport import RedisRetry, Request, Transport, now_ms
from fedasync.shared.decision import Decision, Outcome
from fedasync.shared.device_auth import SigningKey
from fedasync.shared.ingest_protocol import NOT_DECIDED, read_headers, receipt_path
from fedasync.shared.keys import Keys

_DECISION_FIELDS = frozenset(f.name for f in fields(Decision))


@dataclass(frozen=True, slots=True)
class Receipt:
    """The decision about one update, or None while there is none (not decided yet, unknown, or
    older than the receipts the system keeps). `ledger_id` and `stream_id` place it in the
    ledger and the updates stream; `decided_at` is when it was decided (Unix seconds)."""

    update_id: str
    decision: Decision | None = None
    ledger_id: str | None = None
    stream_id: str | None = None
    decided_at: float | None = None

    @property
    def decided(self) -> bool:
        return self.decision is not None

    @property
    def outcome(self) -> Outcome | None:
        return None if self.decision is None else self.decision.outcome

    @classmethod
    def from_record(cls, update_id: str, record: Mapping[str, Any]) -> Receipt:
        """A ledger record (as `fedasync ledger export` writes it, plus `ledger_id`)."""
        try:
            decision = Decision.from_dict(
                {k: v for k, v in record.items() if k in _DECISION_FIELDS}
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UnexpectedAnswer(f"not a ledger record: {exc}") from None
        if decision.update_id != update_id:
            raise UnexpectedAnswer(f"asked for {update_id!r}, got {decision.update_id!r}")
        return cls(
            update_id,
            decision,
            _text(record.get("ledger_id")),
            _text(record.get("stream_id")),
            None if record.get("at") is None else float(record["at"]),
        )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


async def over_http(
    transport: Transport,
    base_url: str,
    key: SigningKey,
    client_id: str,
    update_id: str,
    run: str | None = None,
) -> Receipt:
    """Ask the ingest service (`run`'s route; None: the legacy one); the request is signed
    afresh on each attempt."""
    request = Request(
        "GET",
        base_url.rstrip("/") + receipt_path(update_id, run),
        lambda: read_headers(key, client_id, now_ms(), update_id, run),
    )
    answer = await transport.send("receipt", request)
    if answer.status == 200:
        return Receipt.from_record(update_id, answer.json)
    if answer.status == 404 and answer.reason == NOT_DECIDED:
        return Receipt(update_id)
    raise Refused(answer.status, answer.reason, answer.error)


async def from_redis(
    redis: aioredis.Redis, keys: Keys, client_id: str, update_id: str, retry: RedisRetry
) -> Receipt:
    """Look the receipt up in Redis (the worker user may read the index and the ledger)."""
    record = await retry("receipt", lambda: lookup(redis, keys, client_id, update_id))
    return Receipt(update_id) if record is None else Receipt.from_record(update_id, record)
