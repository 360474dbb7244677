"""A torch module's tensors as the one flat float32 vector the core moves, and back.

The order is the module's `state_dict` order, so the same class always gives the same layout.
What goes in is an explicit choice (`buffers=`): parameters always; with `buffers=True` also the
floating buffers (BatchNorm's running mean and variance), so they are averaged like weights; with
`buffers=False` every buffer stays the device's own. Rules, each to keep a round trip exact:

- float32, float16 and bfloat16 tensors travel as float32 (exact); loading casts back.
- A parameter of any other dtype (float64 would lose precision, integers and complex are not
  weights) is refused with `UnsupportedTensorError`, naming it.
- A non-floating *buffer* (BatchNorm's `num_batches_tracked`, masks) is a counter, not a weight:
  it is never carried, whatever `buffers` says, and keeps the value the module has. A float64
  buffer is refused like a parameter.
- A tensor shared under two names (tied weights) travels once, under its first name.
- Non-persistent buffers are not in the state dict, so they are not carried either.

torch is imported when a function runs, never at import, so that importing this module (and the
tasks built on it) costs nothing where torch is not installed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fedasync.shared.layout import Layout, LayoutError

if TYPE_CHECKING:
    import torch

#: the dtypes a parameter or carried buffer may have: each is exact in the float32 vector
CARRIED = ("torch.float32", "torch.float16", "torch.bfloat16")


class UnsupportedTensorError(LayoutError):
    """A tensor the flat float32 vector cannot carry exactly; `tensor` is its state_dict name."""

    def __init__(self, tensor: str, detail: str) -> None:
        super().__init__(f"tensor {tensor!r}: {detail}")
        self.tensor = tensor


class VectorMismatchError(LayoutError):
    """A weight vector that does not fit the module; `tensor` names the first one that differs."""

    def __init__(self, tensor: str | None, detail: str) -> None:
        super().__init__(f"tensor {tensor!r}: {detail}" if tensor else detail)
        #: None when the module carries no tensor at all
        self.tensor = tensor


def carried(module: torch.nn.Module, *, buffers: bool) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs the vector holds, in state_dict order, dtypes checked."""
    import torch

    if not isinstance(buffers, bool):  # "false" or 0 would otherwise pass as a choice
        raise TypeError(f"buffers must be True or False, got {buffers!r}")
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    for name, value in module.state_dict(keep_vars=True).items():
        if not isinstance(value, torch.Tensor):
            raise UnsupportedTensorError(name, f"is {type(value).__name__}, not a tensor")
        is_param = isinstance(value, torch.nn.Parameter)
        if not is_param and not (buffers and value.is_floating_point()):
            continue  # a buffer left out by choice, or a counter (never carried)
        dtype = str(value.dtype)
        if dtype not in CARRIED:
            kind = "parameter" if is_param else "buffer"
            raise UnsupportedTensorError(
                name,
                f"{kind} of dtype {dtype} cannot travel as float32 exactly (accepted: "
                f"{', '.join(CARRIED)}); convert the module (e.g. module.float()) or keep it "
                "out of the state dict",
            )
        if id(value) in seen:
            continue  # tied: the same tensor under a second name
        seen.add(id(value))
        out.append((name, value))
    return out


def layout_of(module: torch.nn.Module, *, buffers: bool) -> Layout:
    """The layout of `module`'s vector: its carried tensors' names and shapes."""
    return Layout.of((name, tuple(t.shape)) for name, t in carried(module, buffers=buffers))


def to_vector(module: torch.nn.Module, *, buffers: bool) -> np.ndarray:
    """A new float32 vector of the carried tensors' values (never a view of the module)."""
    import torch

    tensors = [
        t.detach().reshape(-1).to("cpu", torch.float32) for _, t in carried(module, buffers=buffers)
    ]
    if not tensors:
        return np.zeros(0, np.float32)
    return torch.cat(tensors).numpy()  # cat allocates: no memory shared with the module


def load_vector(
    module: torch.nn.Module,
    vector: np.ndarray,
    *,
    buffers: bool,
    layout: Layout | None = None,
) -> None:
    """Copy `vector` into `module`'s carried tensors; `layout`, if given, must be the module's."""
    import torch

    entries = carried(module, buffers=buffers)
    if layout is not None:
        check_layout(layout, entries)
    if not isinstance(vector, np.ndarray) or vector.dtype != np.float32 or vector.ndim != 1:
        raise VectorMismatchError(
            entries[0][0] if entries else None,
            f"a weight vector is a 1-D float32 array, got {describe(vector)}",
        )
    check_size(vector.size, entries)
    offset = 0
    with torch.no_grad():
        for _, tensor in entries:
            n = tensor.numel()
            # torch.tensor copies (and accepts a read-only array, unlike from_numpy)
            source = torch.tensor(vector[offset : offset + n]).reshape(tensor.shape)
            tensor.copy_(source)  # casts to the tensor's dtype and device
            offset += n


def check_layout(layout: Layout, entries: list[tuple[str, torch.Tensor]]) -> None:
    """Name the first tensor where `layout` and the module disagree."""
    mine = [(name, tuple(t.shape)) for name, t in entries]
    for index, (theirs, ours) in enumerate(zip(layout.tensors, mine, strict=False)):
        if theirs != ours:
            raise VectorMismatchError(
                ours[0],
                f"tensor #{index} is {theirs[0]!r} {theirs[1]} in the vector's layout "
                f"but {ours[0]!r} {ours[1]} in the module",
            )
    if len(layout.tensors) > len(mine):
        name, shape = layout.tensors[len(mine)]
        raise VectorMismatchError(name, f"in the vector's layout {shape} but not in the module")
    if len(mine) > len(layout.tensors):
        name, shape = mine[len(layout.tensors)]
        raise VectorMismatchError(name, f"in the module {shape} but not in the vector's layout")


def check_size(size: int, entries: list[tuple[str, torch.Tensor]]) -> None:
    """Name the tensor a too-short vector ends in, or the last one a too-long vector exceeds."""
    offset = 0
    for name, tensor in entries:
        n = math.prod(tensor.shape)
        if offset + n > size:
            raise VectorMismatchError(
                name,
                f"needs values {offset}..{offset + n - 1} but the vector has {size} values "
                f"(the module's tensors need {sum(t.numel() for _, t in entries)})",
            )
        offset += n
    if size > offset:
        last = entries[-1][0] if entries else None
        raise VectorMismatchError(
            last, f"the module's tensors end at {offset}, but the vector has {size} values"
        )


def describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return type(value).__name__
