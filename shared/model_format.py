"""The model snapshot message: what the snapshot service serves and devices download.

msgpack like the update message (docs/wire-format.md), built from the same array encoding:
the version, the layout that cuts the flat vector into named tensors, and the weights.
Snapshots come from our own aggregator, but devices parse them, so decoding is just as strict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedasync.shared.aggregation import ModelSnapshot
from fedasync.shared.layout import Layout, LayoutError
from fedasync.shared.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    WireError,
    WireReason,
    decode_array,
    encode_array,
    pack,
    unpack,
)

MODEL_SCHEMA_VERSION = 1
_FIELDS = ("schema", "version", "layout", "weights", "created_at")


@dataclass(frozen=True, slots=True, eq=False)
class ModelMessage:
    """A decoded snapshot: the model and when its version was committed."""

    snapshot: ModelSnapshot
    created_at: float


def encode_model(snapshot: ModelSnapshot, created_at: float) -> bytes:
    """Snapshot → bytes, always float32 (devices train from full precision)."""
    return pack(
        {
            "schema": MODEL_SCHEMA_VERSION,
            "version": snapshot.version,
            "layout": snapshot.layout.to_list(),
            "weights": encode_array(snapshot.weights, "float32"),
            "created_at": float(created_at),
        }
    )


def decode_model(raw: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> ModelMessage:
    """Bytes → ModelMessage, or WireError with a reason."""
    message = unpack(raw, max_bytes)
    if not isinstance(message, dict):
        raise WireError(WireReason.NOT_A_MAP, "top level must be a map")
    for key in message:
        if key not in _FIELDS:
            raise WireError(WireReason.UNKNOWN_FIELD, repr(key))
    for key in _FIELDS:
        if key not in message:
            raise WireError(WireReason.MISSING_FIELD, key)
    if message["schema"] != MODEL_SCHEMA_VERSION:
        raise WireError(WireReason.UNKNOWN_SCHEMA, f"model schema {message['schema']!r}")
    version = message["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise WireError(WireReason.BAD_VALUE, f"version {version!r}")
    try:
        layout = Layout.from_list(message["layout"])
    except (LayoutError, TypeError, ValueError) as exc:
        raise WireError(WireReason.BAD_VALUE, f"layout: {exc}") from None
    weights = decode_array(message["weights"], "weights")
    if weights.shape != (layout.size,):
        raise WireError(
            WireReason.SIZE_MISMATCH, f"weights shape {weights.shape}, layout needs {layout.size}"
        )
    created = message["created_at"]
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        raise WireError(WireReason.WRONG_TYPE, "created_at must be a float")
    if not math.isfinite(created):
        raise WireError(WireReason.BAD_VALUE, "created_at must be finite")
    return ModelMessage(ModelSnapshot(version, weights, layout), float(created))


def summary(message: ModelMessage) -> dict[str, Any]:
    """JSON-ready metadata without the weights."""
    snap = message.snapshot
    return {
        "version": snap.version,
        "layout": snap.layout.to_list(),
        "parameters": snap.layout.size,
        "created_at": message.created_at,
    }


def to_safetensors(snapshot: ModelSnapshot) -> bytes:
    """The same weights as a safetensors file, for tools that read that format (no torch needed).

    Layout: 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
    and byte range, then the raw little-endian float32 data, which is our flat vector as is.
    """
    header: dict[str, Any] = {"__metadata__": {"version": str(snapshot.version)}}
    offset = 0
    for name, shape in snapshot.layout.tensors:
        size = math.prod(shape) * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to a multiple of 8
    data = np.ascontiguousarray(snapshot.weights, dtype="<f4").tobytes()
    return len(text).to_bytes(8, "little") + text + data
