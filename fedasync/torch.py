"""The torch adapter: any `torch.nn.Module` as the flat float32 vector fedasync moves, and back.

The core, the wire and the aggregator know one thing about a model: a flat float32 vector in a
fixed `Layout` (ordered tensor names and shapes). This module maps a module onto that form:

    layout = layout_of(net, buffers=False)       # names and shapes, in state_dict order
    vector = to_vector(net, buffers=False)       # a new float32 array (never a view of net)
    load_vector(net, vector, buffers=False, layout=layout)   # copies into net's own tensors

`buffers` is required: `True` also carries floating buffers (BatchNorm's running mean and
variance), averaged like weights; `False` keeps every buffer out of the vector, so each run (and
the evaluation of a served model) starts from the module's initial buffers: with BatchNorm,
`True` is usually what you want. Whatever the choice,
non-floating buffers (BatchNorm's int64 `num_batches_tracked`) are counters, never carried, and
keep the module's value. Parameters and carried buffers must be float32, float16 or bfloat16
(exact in float32); any other dtype raises `UnsupportedTensorError` naming the tensor. A vector of
the wrong size, dtype or layout raises `VectorMismatchError` naming the first tensor that does
not fit. Both are `fedasync.shared.layout.LayoutError`, a `ValueError`.

`TorchTask` makes a fedasync Task from a model factory, a data function and, if the default
(cross-entropy on logits; MSE when `num_classes` is 0) is wrong, the loss of a batch:

    class Cifar(TorchTask):
        def __init__(self, width: int = 16) -> None:
            self.width = width  # before super().__init__, which builds model() for the layout
            super().__init__(name="cifar", num_classes=10, buffers=True,
                             suggested=TrainParams(epochs=1, lr=0.05, batch_size=32))
        def model(self) -> nn.Module: return SmallCNN(self.width)
        def dataset(self, rng): return split(Dataset(X, y), 0.2, rng)   # X as 2-D rows

Features reach the model as 2-D float32 rows (a `Dataset`); reshape images in `forward`. Override
`optimizer` for momentum or Adam (default: plain SGD), or `train` entirely (the building blocks
`seeded`, `load`, `vector` and `tensors` stay available). Training is reproducible to the bit:
shuffling comes from the numpy generator fedasync passes, torch's generator is seeded from a child
of it per call and restored afterwards, and torch runs on one thread (`threads`). Training runs on
the CPU.

Importing this module does not import torch; calling into it does. A task whose services run
without torch (the aggregator creates version 0, the evaluator scores versions) passes `layout=`
and overrides `init_weights` and `evaluate` in numpy, as the built-in digits task does.
"""

from __future__ import annotations

from fedasync.learning.torch_task import TorchTask
from fedasync.learning.torch_weights import (
    UnsupportedTensorError,
    VectorMismatchError,
    layout_of,
    load_vector,
    to_vector,
)

__all__ = [
    "TorchTask",
    "UnsupportedTensorError",
    "VectorMismatchError",
    "layout_of",
    "load_vector",
    "to_vector",
]
