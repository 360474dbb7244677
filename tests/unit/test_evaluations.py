"""Evaluation records: what the evaluator writes and the dashboard and report read."""

from __future__ import annotations

import json
import math

from fedasync.learning.evaluation import Evaluation
from fedasync.services.stores.evaluations import EvaluationRecord


def not_json(name: str) -> float:
    raise ValueError(f"{name} in the record")


def test_a_diverged_model_is_recorded_as_null_not_nan() -> None:
    diverged = Evaluation(loss=math.nan, num_samples=10, accuracy=0.1, per_class={0: 0.1})
    record = EvaluationRecord.of(4, 1.0, diverged, at=2.0, seconds=0.01)
    assert record.loss is None
    text = record.to_json()
    json.loads(text, parse_constant=not_json)  # NaN and Infinity are not JSON
    assert EvaluationRecord.from_json(text) == record


def test_a_record_round_trips_through_json() -> None:
    scored = Evaluation(loss=0.3, num_samples=10, accuracy=0.9, per_class={1: 0.8, 0: 1.0})
    record = EvaluationRecord.of(7, 1.5, scored, at=2.5, seconds=0.02)
    assert record.per_class == {"0": 1.0, "1": 0.8}
    assert EvaluationRecord.from_json(record.to_json()) == record
