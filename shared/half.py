"""float16 weights widened to float32 exactly, several times faster than numpy's own cast.

Updates may travel as float16 (`FEDASYNC_WIRE__DTYPE=float16`, half the bytes to read) and the
core mixes in float32. numpy casts float16 element by element (about 1.1 ms per million values on
the development machine, 2.8 ms into a fresh array), which made a float16 update slower to decide
than the float32 one it halves. Here the cast is integer work on whole arrays: the float16 bits
without their sign, shifted into a float32's exponent and mantissa, are the value scaled by
2⁻¹¹², so one multiply by 2¹¹² restores it (subnormal float16 included: they become normal float32
values, the multiply is exact), and the sign bit is put back. About 0.35 ms per million values.

Bit for bit numpy's cast for every float16 value (`tests/unit/test_half.py` checks all 65,536):
an array holding Inf or NaN, which the shift would not map, takes numpy's cast instead.
"""

from __future__ import annotations

import numpy as np

_SCALE = np.float32(2.0**112)
_EXPONENT = np.uint16(0x7C00)


def to_float32(values: np.ndarray) -> np.ndarray:
    """`values` as float32: itself if already float32, a new array if float16."""
    if values.dtype != np.float16:
        return values.astype(np.float32, copy=False)
    bits = values.view(np.uint16)
    if (np.bitwise_and(bits, _EXPONENT) == _EXPONENT).any():  # Inf or NaN: numpy's cast
        return values.astype(np.float32)
    out = np.empty(values.shape, dtype=np.uint32)
    np.copyto(out, bits, casting="unsafe")
    sign = np.bitwise_and(out, np.uint32(0x8000))
    np.left_shift(sign, np.uint32(16), out=sign)
    np.bitwise_and(out, np.uint32(0x7FFF), out=out)
    np.left_shift(out, np.uint32(13), out=out)
    widened = out.view(np.float32)
    np.multiply(widened, _SCALE, out=widened)
    np.bitwise_or(out, sign, out=out)
    return widened
