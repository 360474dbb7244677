"""The largest update of a model (shared/update_size.py) and the layout read from a model's
first bytes, against the real encoders."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from fedasync.shared.aggregation import ModelSnapshot
from fedasync.shared.layout import Layout, LayoutError
from fedasync.shared.model_format import encode_model
from fedasync.shared.update import MAX_ID_LENGTH, Update
from fedasync.shared.update_size import UPDATE_OVERHEAD_BYTES, layout_in_head, max_update_bytes
from fedasync.shared.wire import MAX_METRIC_NAME_LENGTH, MAX_METRICS, decode_update, encode_update

#: a character of four bytes in UTF-8
WIDE = "\U0001f600"


@pytest.mark.parametrize("parameters", [0, 1, 1000, 250_000])
def test_the_largest_valid_update_of_a_model_fits_its_bound(parameters: int) -> None:
    """Every field at its longest: ids of 128 four-byte characters, 32 metrics with names of
    64 of them, numbers at their widest; the bound is not loose by more than its headers."""
    metrics = {f"{WIDE * (MAX_METRIC_NAME_LENGTH - 2)}{i:02x}": 1.5 for i in range(MAX_METRICS)}
    update = Update(
        WIDE * MAX_ID_LENGTH,
        WIDE * MAX_ID_LENGTH,
        2**63 - 1,
        2**31 - 1,
        np.ones(parameters, np.float32),
        created_at=1.7e9,
        metrics=metrics,
    )
    body = encode_update(update)
    decode_update(body)  # valid
    assert len(body) <= max_update_bytes(parameters) < len(body) + 1024


def widest(value: Any) -> bytes:
    """msgpack in its least compact valid forms: 32-bit lengths everywhere, every number in
    9 bytes (what a client in another language might write)."""
    if isinstance(value, dict):
        head = b"\xdf" + len(value).to_bytes(4, "big")
        return head + b"".join(widest(k) + widest(v) for k, v in value.items())
    if isinstance(value, list):
        return b"\xdd" + len(value).to_bytes(4, "big") + b"".join(widest(v) for v in value)
    if isinstance(value, str):
        return b"\xdb" + len(value.encode()).to_bytes(4, "big") + value.encode()
    if isinstance(value, bytes):
        return b"\xc6" + len(value).to_bytes(4, "big") + value
    if isinstance(value, int):
        return b"\xcf" + value.to_bytes(8, "big")
    return b"\xcb" + struct.pack(">d", value)


def test_the_bound_holds_the_least_compact_valid_encoding() -> None:
    parameters = 1000
    data = np.ones(parameters, np.float32).tobytes()
    message = {
        "schema": 1,
        "update_id": WIDE * MAX_ID_LENGTH,
        "client_id": WIDE * MAX_ID_LENGTH,
        "base_version": 2**63 - 1,
        "num_samples": 2**31 - 1,
        "weights": {"dtype": "float32", "shape": [parameters, 1, 1, 1, 1, 1, 1, 1], "data": data},
        "created_at": 1.7e9,
        "metrics": {
            f"{WIDE * (MAX_METRIC_NAME_LENGTH - 2)}{i:02x}": 1.5 for i in range(MAX_METRICS)
        },
    }
    body = widest(message)
    decode_update(body)  # valid
    assert len(body) <= max_update_bytes(parameters)


def test_the_layout_is_read_from_the_first_bytes_of_a_model() -> None:
    layout = Layout.of([("conv.weight", (8, 3, 3, 3)), ("fc.weight", (10, 72)), ("fc.bias", (10,))])
    message = encode_model(ModelSnapshot(7, np.zeros(layout.size, np.float32), layout), 1.0)
    found = [layout_in_head(message[:n], whole=False) for n in range(len(message) + 1)]
    first = next(n for n, value in enumerate(found) if value is not None)
    assert first < 200 < layout.size * 4  # well before the weights
    assert all(value == layout for value in found[first:])
    assert layout_in_head(message, whole=True) == layout


def test_a_model_message_without_a_layout_is_a_layout_error() -> None:
    with pytest.raises(LayoutError):
        layout_in_head(msgpack.packb({"schema": 1, "version": 0}), whole=True)
    with pytest.raises(LayoutError):
        layout_in_head(msgpack.packb({"layout": [["w", [-1]]]}), whole=True)
    with pytest.raises(LayoutError):  # the whole message, cut off before its layout ends
        layout_in_head(msgpack.packb({"layout": [["w", [3]]]})[:-2], whole=True)


def test_the_docs_state_the_overhead_the_code_computes() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    stated = f"{UPDATE_OVERHEAD_BYTES:,}"
    for name in ("configuration.md", "wire-format.md", "security.md"):
        assert stated in (docs / name).read_text(), name
