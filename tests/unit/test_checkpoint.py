"""Checkpoints: a mid-buffer FedBuff state survives save and load; corrupt bytes are refused."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from fedasync.shared.checkpoint import CheckpointError, load_state, save_state
from fedasync.shared.policy import Policy
from fedasync.shared.wire import pack
from tests.unit.helpers import make_state, make_update


def test_mid_buffer_fedbuff_state_round_trips() -> None:
    state = make_state(size=3)
    policy = Policy.fedbuff(buffer_size=3)
    for i in range(5):
        state.apply(make_update(f"u{i}", state.version, float(i), size=3), policy)
    again = load_state(save_state(state))
    assert again.version == state.version == 1  # one server step of 3; 2 buffered
    assert again.buffer.count == state.buffer.count == 2
    np.testing.assert_array_equal(again.buffer.total, state.buffer.total)
    assert [v for v, _ in again.history] == [v for v, _ in state.history]
    assert again.counters == state.counters
    assert "u3" in again.dedup
    assert save_state(again) == save_state(state)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        pack({"format": 99}),
        pack([1, 2]),
        pack({"format": 1, "version": 0}),
    ],
)
def test_corrupt_checkpoints_are_refused(raw: bytes) -> None:
    with pytest.raises(CheckpointError):
        load_state(raw)


def test_wrong_weight_length_is_refused() -> None:
    data = msgpack.unpackb(save_state(make_state(size=3)), raw=False)
    data["weights"] = np.zeros(2, "<f4").tobytes()
    with pytest.raises(CheckpointError, match="byte length"):
        load_state(pack(data))


def test_weights_can_be_kept_elsewhere() -> None:
    state = make_state(size=3)
    state.apply(make_update("u", 0, 2.0, size=3), Policy())
    state.close("max_updates")
    raw = save_state(state, include_weights=False)
    assert len(raw) < len(save_state(state))
    with pytest.raises(CheckpointError, match="weights"):
        load_state(raw)
    again = load_state(raw, weights=state.weights_view())
    assert save_state(again) == save_state(state)
    assert again.closed == "max_updates"
    with pytest.raises(CheckpointError, match="weights"):
        load_state(save_state(state), weights=state.weights_view())


def test_a_format_2_checkpoint_mid_fedbuff_buffer_restores_and_decides_the_same() -> None:
    """Written by the build before the client book: no book, memory or tiers, and a buffer
    without its weight sum (each FedBuff weight was 1, so it is the count)."""
    state = make_state(size=3)
    policy = Policy.fedbuff(buffer_size=3)
    for i in range(4):
        state.apply(make_update(f"u{i}", state.version, float(i), size=3), policy)
    data = msgpack.unpackb(save_state(state), raw=False)
    for key in ("clients", "memory", "tiers"):
        del data[key]
    del data["buffer"]["weight"]
    data["format"] = 2
    old = load_state(pack(data))
    assert old.buffer.weight == old.buffer.count == 1
    follow = make_update("next", state.version, 2.0, size=3)
    assert old.apply(follow, policy) == state.apply(follow, policy)
    assert old.weights_view().tobytes() == state.weights_view().tobytes()
