"""The update codec: round trip, the documented example, and every refusal with its reason."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from fedasync.shared.update import Update
from fedasync.shared.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    WireError,
    WireReason,
    decode_update,
    encode_update,
    pack,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"


def sample(**changes: Any) -> Update:
    fields: dict[str, Any] = {
        "update_id": "u-0001",
        "client_id": "dev-7",
        "base_version": 41,
        "num_samples": 32,
        "weights": np.array([0.5, -1.25, 2.0], np.float32),
        "created_at": 1764489600.25,
        "metrics": {"loss": 0.5},
    }
    fields.update(changes)
    return Update(**fields)


_DELETE = object()


def changed(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with some keys replaced, added, or removed (value _DELETE)."""
    out = {k: v for k, v in base.items() if changes.get(k) is not _DELETE}
    out.update({k: v for k, v in changes.items() if v is not _DELETE})
    return out


def message(**changes: Any) -> dict[str, Any]:
    """A valid message as a plain dict, to corrupt one field at a time."""
    return changed(msgpack.unpackb(encode_update(sample()), raw=False), changes)


def reason_of(raw: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> WireReason:
    with pytest.raises(WireError) as info:
        decode_update(raw, max_bytes=max_bytes)
    assert info.value.detail
    return info.value.reason


def test_round_trip_float32() -> None:
    update = sample()
    decoded = decode_update(encode_update(update))
    assert (decoded.update_id, decoded.client_id, decoded.base_version) == ("u-0001", "dev-7", 41)
    assert (decoded.num_samples, decoded.created_at, dict(decoded.metrics)) == (
        32,
        1764489600.25,
        {"loss": 0.5},
    )
    assert decoded.weights.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(decoded.weights, update.weights)
    assert not decoded.weights.flags.writeable


def test_float16_is_half_the_size_and_close() -> None:
    weights = np.linspace(-3, 3, 1000, dtype=np.float32)
    full = encode_update(sample(weights=weights))
    half = encode_update(sample(weights=weights), dtype="float16")
    assert len(full) - len(half) == 2000
    decoded = decode_update(half)
    assert decoded.weights.dtype == np.dtype("<f2")
    np.testing.assert_allclose(decoded.weights, weights, atol=2e-3)


def test_encoder_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(WireError) as info:
        encode_update(sample(weights=np.array([1e6], np.float32)), dtype="float16")
    assert info.value.reason is WireReason.NON_FINITE
    with pytest.raises(WireError) as info:
        encode_update(sample(weights=np.array([np.nan], np.float32)))
    assert info.value.reason is WireReason.NON_FINITE
    with pytest.raises(WireError) as info:
        encode_update(sample(update_id=""))
    assert info.value.reason is WireReason.BAD_VALUE


def test_decodes_exactly_the_bytes_shown_in_the_doc() -> None:
    text = DOC.read_text()
    block = re.search(r"```hex\n(.*?)```", text, re.S)
    assert block is not None
    raw = bytes.fromhex("".join(block.group(1).split()))
    assert f"These are the {len(raw)} bytes" in text
    decoded = decode_update(raw)
    assert (decoded.update_id, decoded.client_id) == ("u-0001", "dev-7")
    assert (decoded.base_version, decoded.num_samples) == (41, 32)
    assert decoded.weights.tolist() == [0.5, -1.25, 2.0]
    assert decoded.created_at == 1764489600.25
    assert dict(decoded.metrics) == {"loss": 0.5}
    assert encode_update(sample()) == raw  # our encoder writes exactly the documented bytes


def test_size_is_checked_before_parsing() -> None:
    raw = encode_update(sample())
    assert reason_of(raw, max_bytes=len(raw) - 1) is WireReason.TOO_LARGE
    assert decode_update(raw, max_bytes=len(raw)).update_id == "u-0001"
    # garbage that is too large is refused as too large, not as malformed: it was never parsed
    assert reason_of(b"\xc1" * 2000, max_bytes=1024) is WireReason.TOO_LARGE


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", WireReason.MALFORMED),
        (b"\xc1", WireReason.MALFORMED),  # never-used byte
        (pack({"schema": 1}) + b"\x00", WireReason.MALFORMED),  # trailing bytes
        (b"\xa2\xff\xfe", WireReason.MALFORMED),  # invalid UTF-8 in a str
        (b"\x91" * 5000 + b"\x00", WireReason.MALFORMED),  # nesting too deep
        (pack([1, 2, 3]), WireReason.NOT_A_MAP),
        (msgpack.packb(msgpack.ExtType(5, b"abc")), WireReason.EXT_TYPE),
        (pack({"schema": 1, "x": msgpack.ExtType(1, b"")}), WireReason.EXT_TYPE),
        (pack({"schema": 1, "x": msgpack.Timestamp(1, 0)}), WireReason.EXT_TYPE),
        (b"\x82\xa1a\x01\xa1a\x02", WireReason.DUPLICATE_KEY),
        (pack({"update_id": "x"}), WireReason.MISSING_FIELD),
    ],
)
def test_structural_refusals(raw: bytes, reason: WireReason) -> None:
    assert reason_of(raw) is reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"schema": 2}, WireReason.UNKNOWN_SCHEMA),
        ({"schema": 0}, WireReason.UNKNOWN_SCHEMA),
        ({"schema": "1"}, WireReason.WRONG_TYPE),
        ({"schema": True}, WireReason.WRONG_TYPE),
        ({"extra": 1}, WireReason.UNKNOWN_FIELD),
        ({"client_id": _DELETE}, WireReason.MISSING_FIELD),
        ({"weights": _DELETE}, WireReason.MISSING_FIELD),
        ({"created_at": _DELETE}, WireReason.MISSING_FIELD),
        ({"update_id": b"u-0001"}, WireReason.WRONG_TYPE),
        ({"update_id": ""}, WireReason.BAD_VALUE),
        ({"update_id": "x" * 129}, WireReason.BAD_VALUE),
        ({"client_id": "a\nb"}, WireReason.BAD_VALUE),
        ({"base_version": -1}, WireReason.BAD_VALUE),
        ({"base_version": 2**64 - 1}, WireReason.BAD_VALUE),
        ({"base_version": 1.0}, WireReason.WRONG_TYPE),
        ({"base_version": False}, WireReason.WRONG_TYPE),
        ({"num_samples": 0}, WireReason.BAD_VALUE),
        ({"created_at": "now"}, WireReason.WRONG_TYPE),
        ({"created_at": float("inf")}, WireReason.BAD_VALUE),
        ({"created_at": -1.0}, WireReason.BAD_VALUE),
        ({"metrics": [1]}, WireReason.WRONG_TYPE),
        ({"metrics": {"loss": "low"}}, WireReason.WRONG_TYPE),
        ({"metrics": {"loss": float("nan")}}, WireReason.NON_FINITE),
        ({"metrics": {f"m{i}": 1.0 for i in range(33)}}, WireReason.BAD_VALUE),
        ({"metrics": {"": 1.0}}, WireReason.BAD_VALUE),
        ({"weights": [1.0, 2.0]}, WireReason.WRONG_TYPE),
    ],
)
def test_field_refusals(changes: dict[str, Any], reason: WireReason) -> None:
    assert reason_of(pack(message(**changes))) is reason


def weights_field(**changes: Any) -> dict[str, Any]:
    """The sample's valid weights map, to corrupt one key at a time."""
    return changed(message()["weights"], changes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"dtype": "float64"}, WireReason.BAD_DTYPE),
        ({"dtype": "int8"}, WireReason.BAD_DTYPE),
        ({"dtype": 4}, WireReason.BAD_DTYPE),
        ({"shape": [4]}, WireReason.SIZE_MISMATCH),
        ({"shape": [2]}, WireReason.SIZE_MISMATCH),
        ({"shape": []}, WireReason.BAD_VALUE),  # a list, of no dimension
        ({"shape": [1] * 9}, WireReason.BAD_VALUE),  # a list, of too many
        ({"shape": [-3]}, WireReason.BAD_VALUE),
        ({"shape": [3.0]}, WireReason.BAD_VALUE),
        ({"shape": 3}, WireReason.WRONG_TYPE),
        ({"data": "abc"}, WireReason.WRONG_TYPE),
        ({"data": b"\x00" * 11}, WireReason.SIZE_MISMATCH),
        ({"data": np.array([0, np.nan, 1], "<f4").tobytes()}, WireReason.NON_FINITE),
        ({"data": np.array([0, -np.inf, 1], "<f4").tobytes()}, WireReason.NON_FINITE),
        ({"data": _DELETE}, WireReason.MISSING_FIELD),
        ({"order": "C"}, WireReason.UNKNOWN_FIELD),
    ],
)
def test_weights_refusals(changes: dict[str, Any], reason: WireReason) -> None:
    assert reason_of(pack(message(weights=weights_field(**changes)))) is reason


def test_float16_infinity_is_refused() -> None:
    data = np.array([1.0, np.inf], "<f2").tobytes()
    raw = pack(message(weights={"dtype": "float16", "shape": [2], "data": data}))
    assert reason_of(raw) is WireReason.NON_FINITE


def test_other_shapes_decode_for_the_state_machine_to_judge() -> None:
    data = np.arange(6, dtype="<f4").tobytes()
    raw = pack(message(weights={"dtype": "float32", "shape": [2, 3], "data": data}))
    assert decode_update(raw).weights.shape == (2, 3)


def test_int_created_at_and_metrics_are_accepted_as_floats() -> None:
    decoded = decode_update(pack(message(created_at=1700000000, metrics={"epochs": 3})))
    assert decoded.created_at == 1700000000.0
    assert isinstance(decoded.created_at, float)
    assert decoded.metrics == {"epochs": 3.0}


def test_non_bytes_input_is_a_wire_error() -> None:
    with pytest.raises(WireError) as info:
        decode_update("not bytes")  # type: ignore[arg-type]
    assert info.value.reason is WireReason.WRONG_TYPE
