"""The fast float16 → float32 cast (shared/half.py) is numpy's cast, bit for bit."""

from __future__ import annotations

import numpy as np

from fedasync.shared.half import to_float32


def test_every_float16_value_widens_to_the_bits_numpy_gives() -> None:
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)]
    assert finite.size == 63488
    assert np.array_equal(
        to_float32(finite).view(np.uint32), finite.astype(np.float32).view(np.uint32)
    )


def test_an_array_holding_inf_or_nan_keeps_them() -> None:
    values = np.array([1.5, np.inf, -np.inf, np.nan, -0.0, 6e-8], dtype=np.float16)
    widened = to_float32(values)
    assert widened.dtype == np.float32
    assert np.array_equal(widened.view(np.uint32), values.astype(np.float32).view(np.uint32))


def test_float32_passes_through_without_a_copy_and_shape_is_kept() -> None:
    values = np.arange(6, dtype=np.float32)
    assert to_float32(values) is values
    half = np.arange(6, dtype=np.float16).reshape(2, 3)
    assert to_float32(half).shape == (2, 3)
    assert np.array_equal(to_float32(half), half.astype(np.float32))
