"""The update message on the wire: msgpack, strictly decoded, never pickle.

Bytes from a device are untrusted. Decoding checks the size before parsing, refuses extension
types, duplicate keys, unknown fields and unknown schema versions, requires the exact byte length
for the declared shape and finite values only. Every failure is one `WireError` with a
machine-readable `reason`, so the aggregator can dead-letter it and count it by reason.
The format is specified for other languages in docs/wire-format.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np

from fedasync.shared.update import MAX_ID_LENGTH, Update

SCHEMA_VERSION = 1
#: Default cap on an encoded update; settings may lower or raise it.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_METRICS = 32
MAX_METRIC_NAME_LENGTH = 64
MAX_DIMS = 8
MAX_BASE_VERSION = 2**63 - 1
MAX_NUM_SAMPLES = 2**31 - 1

#: Wire dtype names and their little-endian numpy types.
DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}

_REQUIRED = (
    "schema",
    "update_id",
    "client_id",
    "base_version",
    "num_samples",
    "weights",
    "created_at",
)
_OPTIONAL = ("metrics",)
_ARRAY_KEYS = ("dtype", "shape", "data")


class WireReason(StrEnum):
    """Why bytes are not a valid message; stable strings for dead-letter records and metrics."""

    TOO_LARGE = "too_large"
    MALFORMED = "malformed"
    EXT_TYPE = "ext_type"
    DUPLICATE_KEY = "duplicate_key"
    NOT_A_MAP = "not_a_map"
    UNKNOWN_SCHEMA = "unknown_schema"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    WRONG_TYPE = "wrong_type"
    BAD_VALUE = "bad_value"
    BAD_DTYPE = "bad_dtype"
    SIZE_MISMATCH = "size_mismatch"
    NON_FINITE = "non_finite"


class WireError(ValueError):
    """A message that cannot be accepted, with a machine-readable reason and a human detail."""

    def __init__(self, reason: WireReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}")


# ----------------------------------------------------------------------------------- encoding
def encode_array(array: np.ndarray, dtype: str = "float32") -> dict[str, Any]:
    """An array as {dtype, shape, data} with raw little-endian bytes, C order."""
    if dtype not in DTYPES:
        raise WireError(WireReason.BAD_DTYPE, f"dtype {dtype!r}, expected one of {list(DTYPES)}")
    with np.errstate(over="ignore"):  # an overflow becomes Inf, refused just below
        cast = np.ascontiguousarray(array, dtype=DTYPES[dtype])
    if not np.isfinite(cast).all():
        raise WireError(WireReason.NON_FINITE, f"array has NaN or Inf once cast to {dtype}")
    return {"dtype": dtype, "shape": list(cast.shape), "data": cast.tobytes()}


def encode_update(update: Update, dtype: str = "float32") -> bytes:
    """Encode an update; `dtype="float16"` halves the size at the cost of precision."""
    message: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "update_id": update.update_id,
        "client_id": update.client_id,
        "base_version": update.base_version,
        "num_samples": update.num_samples,
        "weights": encode_array(update.weights, dtype),
        "created_at": float(update.created_at),
    }
    if update.metrics:
        message["metrics"] = {str(k): float(v) for k, v in update.metrics.items()}
    check_update_fields(message)
    return pack(message)


def pack(message: Mapping[str, Any]) -> bytes:
    """msgpack with bin for bytes, str for text and float64 floats: the only packing we use."""
    packed: bytes = msgpack.packb(message, use_bin_type=True, use_single_float=False)
    return packed


# ----------------------------------------------------------------------------------- decoding
def unpack(raw: bytes, max_bytes: int) -> Any:
    """Parse msgpack strictly: size checked first, no ext types, no duplicate keys."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise WireError(WireReason.WRONG_TYPE, f"message must be bytes, got {type(raw).__name__}")
    if len(raw) > max_bytes:
        raise WireError(WireReason.TOO_LARGE, f"{len(raw)} bytes > limit {max_bytes}")
    try:
        value = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            object_pairs_hook=_unique_pairs,
        )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise WireError(WireReason.MALFORMED, f"not a single msgpack value: {exc}") from None
    _refuse_timestamps(value)
    return value


def decode_update(raw: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Update:
    """Bytes → Update, or WireError. Weights stay a read-only view of `raw` (no copy)."""
    message = unpack(raw, max_bytes)
    check_update_fields(message)
    return Update(
        update_id=message["update_id"],
        client_id=message["client_id"],
        base_version=message["base_version"],
        num_samples=message["num_samples"],
        weights=decode_array(message["weights"], "weights"),
        created_at=float(message["created_at"]),
        metrics={k: float(v) for k, v in message.get("metrics", {}).items()},
    )


def decode_array(value: Any, field: str) -> np.ndarray:
    """{dtype, shape, data} → read-only ndarray; exact byte length, finite values only."""
    if not isinstance(value, dict):
        raise WireError(WireReason.WRONG_TYPE, f"{field} must be a map")
    _check_keys(value, _ARRAY_KEYS, (), field + ".")
    dtype_name, shape, data = value["dtype"], value["shape"], value["data"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireError(
            WireReason.BAD_DTYPE, f"{field}.dtype {dtype_name!r}, expected {list(DTYPES)}"
        )
    if not isinstance(shape, list):
        raise WireError(
            WireReason.WRONG_TYPE, f"{field}.shape must be a list of 1..{MAX_DIMS} ints"
        )
    if not 1 <= len(shape) <= MAX_DIMS:  # the right type, out of range (docs/wire-format.md)
        raise WireError(
            WireReason.BAD_VALUE, f"{field}.shape has {len(shape)} dimensions, not 1..{MAX_DIMS}"
        )
    if not all(_is_int(d) and d >= 0 for d in shape):
        raise WireError(WireReason.BAD_VALUE, f"{field}.shape {shape!r} must be non-negative ints")
    if not isinstance(data, bytes):
        raise WireError(WireReason.WRONG_TYPE, f"{field}.data must be bin")
    dtype = DTYPES[dtype_name]
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise WireError(
            WireReason.SIZE_MISMATCH,
            f"{field}.data has {len(data)} bytes, shape {shape} of {dtype_name} needs {expected}",
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    if not _all_finite(array):
        raise WireError(WireReason.NON_FINITE, f"{field} contains NaN or Inf")
    return array


def _all_finite(array: np.ndarray) -> bool:
    """No NaN or Inf. numpy emulates float16 arithmetic in software, so a float16 array is
    checked on its bits instead (exponent all ones = Inf or NaN): the same answer, many times
    faster, which is what lets float16 updates be decoded faster than float32 ones."""
    if array.dtype == DTYPES["float16"]:
        exponent = np.bitwise_and(array.view(np.uint16), np.uint16(0x7C00))
        return not bool((exponent == 0x7C00).any())
    return bool(np.isfinite(array).all())


def check_update_fields(message: Any) -> None:
    """Schema, field set and field types of an update message (weights checked separately)."""
    if not isinstance(message, dict):
        raise WireError(
            WireReason.NOT_A_MAP, f"top level must be a map, got {type(message).__name__}"
        )
    if "schema" not in message:
        raise WireError(WireReason.MISSING_FIELD, "schema")
    if not _is_int(message["schema"]):
        raise WireError(WireReason.WRONG_TYPE, "schema must be an int")
    if message["schema"] != SCHEMA_VERSION:
        raise WireError(
            WireReason.UNKNOWN_SCHEMA,
            f"schema {message['schema']}, this build reads {SCHEMA_VERSION}",
        )
    _check_keys(message, _REQUIRED, _OPTIONAL, "")
    for name in ("update_id", "client_id"):
        _check_id(name, message[name])
    _check_int("base_version", message["base_version"], 0, MAX_BASE_VERSION)
    _check_int("num_samples", message["num_samples"], 1, MAX_NUM_SAMPLES)
    created = message["created_at"]
    if not _is_number(created):
        raise WireError(WireReason.WRONG_TYPE, "created_at must be a float (seconds since epoch)")
    if not math.isfinite(created) or created < 0:
        raise WireError(WireReason.BAD_VALUE, f"created_at {created!r} must be finite and >= 0")
    if "metrics" in message:
        _check_metrics(message["metrics"])


def _check_keys(
    value: dict[Any, Any], required: tuple[str, ...], optional: tuple[str, ...], prefix: str
) -> None:
    for key in value:
        if key not in required and key not in optional:
            raise WireError(WireReason.UNKNOWN_FIELD, f"{prefix}{key!r}")
    for key in required:
        if key not in value:
            raise WireError(WireReason.MISSING_FIELD, prefix + key)


def _check_id(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise WireError(WireReason.WRONG_TYPE, f"{name} must be a str")
    if not 1 <= len(value) <= MAX_ID_LENGTH or not value.isprintable():
        raise WireError(
            WireReason.BAD_VALUE, f"{name} must be 1..{MAX_ID_LENGTH} printable characters"
        )


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int(value):
        raise WireError(WireReason.WRONG_TYPE, f"{name} must be an int")
    if not low <= value <= high:
        raise WireError(WireReason.BAD_VALUE, f"{name} {value} outside [{low}, {high}]")


def _check_metrics(metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise WireError(WireReason.WRONG_TYPE, "metrics must be a map of str to number")
    if len(metrics) > MAX_METRICS:
        raise WireError(WireReason.BAD_VALUE, f"{len(metrics)} metrics > limit {MAX_METRICS}")
    for key, val in metrics.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_METRIC_NAME_LENGTH:
            raise WireError(
                WireReason.BAD_VALUE,
                f"metric name {key!r} must be 1..{MAX_METRIC_NAME_LENGTH} chars",
            )
        if not _is_number(val):
            raise WireError(WireReason.WRONG_TYPE, f"metric {key!r} must be a number")
        if not math.isfinite(val):
            raise WireError(WireReason.NON_FINITE, f"metric {key!r} is {val!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(WireReason.EXT_TYPE, f"msgpack extension type {code} is not allowed")


def _unique_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise WireError(WireReason.DUPLICATE_KEY, "a map repeats a key")
    return out


def _refuse_timestamps(value: Any) -> None:
    """msgpack decodes extension -1 (timestamp) itself, bypassing ext_hook; refuse it here."""
    if isinstance(value, (msgpack.Timestamp, msgpack.ExtType)):
        raise WireError(WireReason.EXT_TYPE, "msgpack extension type -1 (timestamp) is not allowed")
    if isinstance(value, dict):
        for item in value.values():
            _refuse_timestamps(item)
    elif isinstance(value, list):
        for item in value:
            _refuse_timestamps(item)
