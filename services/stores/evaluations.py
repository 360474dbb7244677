"""The evaluations stream: one record per evaluated version, written by the evaluator.

One reader and writer for everyone: the evaluator appends, the control service shows the newest
in `/v1/status` and the dashboard's accuracy curve, and `fedasync up` puts the whole curve in the
run folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis

from fedasync.learning.evaluation import Evaluation
from fedasync.services.runtime.redis_conn import stream_entries
from fedasync.shared.keys import Keys

FIELD = "e"


@dataclass(frozen=True, slots=True)
class EvaluationRecord:
    """Scores of one committed version on the held-out test set."""

    version: int
    #: wall-clock time the evaluation finished (unix seconds)
    at: float
    #: when the version was committed (unix seconds), from the model message
    committed_at: float
    #: None when not finite (a diverged model): JSON has no NaN, and the curve shows a gap
    loss: float | None
    #: accuracy for classification, R² for regression (higher is better); None when not finite
    score: float | None
    num_samples: int
    accuracy: float | None = None
    per_class: dict[str, float] = field(default_factory=dict)
    #: seconds the evaluation took
    seconds: float = 0.0

    @classmethod
    def of(
        cls, version: int, committed_at: float, evaluation: Evaluation, at: float, seconds: float
    ) -> EvaluationRecord:
        return cls(
            version=version,
            at=at,
            committed_at=committed_at,
            loss=_finite(evaluation.loss),
            score=_finite(evaluation.score),
            num_samples=evaluation.num_samples,
            accuracy=evaluation.accuracy,
            per_class={str(k): v for k, v in sorted(evaluation.per_class.items())},
            seconds=seconds,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> EvaluationRecord:
        data: dict[str, Any] = json.loads(raw)
        return cls(**data)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


async def append(redis: aioredis.Redis, keys: Keys, record: EvaluationRecord, keep: int) -> bytes:
    """XADD with an approximate MAXLEN: the curve is a report, not a ledger."""
    entry: Any = await redis.xadd(
        keys.evaluations, {FIELD: record.to_json()}, maxlen=keep, approximate=True
    )
    return bytes(entry)


async def latest(redis: aioredis.Redis, keys: Keys) -> EvaluationRecord | None:
    entries: Any = await redis.xrevrange(keys.evaluations, count=1)
    return EvaluationRecord.from_json(entries[0][1][FIELD.encode()]) if entries else None


async def recent(redis: aioredis.Redis, keys: Keys, count: int) -> list[EvaluationRecord]:
    """The newest `count` records, oldest first (the order a curve is drawn in)."""
    entries: Any = await redis.xrevrange(keys.evaluations, count=count)
    return [EvaluationRecord.from_json(e[1][FIELD.encode()]) for e in reversed(entries)]


async def all_records(
    redis: aioredis.Redis, keys: Keys, page: int = 1000
) -> list[EvaluationRecord]:
    return [
        EvaluationRecord.from_json(fields[FIELD.encode()])
        async for _, fields in stream_entries(redis, keys.evaluations, page=page)
    ]
