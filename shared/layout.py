"""Which named tensors a flat weight vector holds, in order.

The core and the wire only ever move one flat float32 vector; the layout is what lets a device (or
torch) cut it back into named tensors, and lets the aggregator refuse a vector of the wrong size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class LayoutError(ValueError):
    """A layout that cannot describe a weight vector (duplicate or empty names, bad shapes)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Ordered (name, shape) pairs; the flat vector is their row-major concatenation."""

    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for name, shape in self.tensors:
            if not isinstance(name, str) or not name:
                raise LayoutError(f"tensor name must be a non-empty string, got {name!r}")
            if name in seen:
                raise LayoutError(f"tensor name {name!r} appears twice")
            seen.add(name)
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise LayoutError(f"shape of {name!r} must be non-negative integers, got {shape!r}")

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, Sequence[int]]]) -> Layout:
        return cls(tuple((name, tuple(shape)) for name, shape in tensors))

    @classmethod
    def flat(cls, size: int, name: str = "weights") -> Layout:
        """A single 1-D tensor, for models that are just a vector (e.g. linear regression)."""
        return cls(((name, (size,)),))

    @property
    def size(self) -> int:
        """Number of float parameters in the flat vector."""
        return sum(math.prod(shape) for _, shape in self.tensors)

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views of `flat` shaped as the named tensors (no copies)."""
        if flat.ndim != 1 or flat.size != self.size:
            raise LayoutError(
                f"expected a flat vector of {self.size} values, got shape {flat.shape}"
            )
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, shape in self.tensors:
            n = math.prod(shape)
            out[name] = flat[offset : offset + n].reshape(shape)
            offset += n
        return out

    def to_list(self) -> list[list[Any]]:
        return [[name, list(shape)] for name, shape in self.tensors]

    @classmethod
    def from_list(cls, data: Sequence[Sequence[Any]]) -> Layout:
        try:
            return cls.of((name, list(shape)) for name, shape in data)
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"not a layout: {exc}") from exc
