"""fedasync: asynchronous federated learning over Redis Streams.

The one import name of the distribution. The repository keeps its parts at its top (`shared/` the
pure core, `services/` the services, `learning/` the tasks, `sim/` the simulator); each is a
subpackage here (`fedasync.shared`, ...), linked into this folder, so the installed wheel holds
`fedasync` and nothing else at the top of site-packages. The public API is what this module
exports; everything under the subpackages is internal and may change between versions.

Writing a task of your own (name it `package.module:attribute` wherever a task is named):

- `Task`: the interface: `init_weights`, `dataset`, `train`, `evaluate`, and the attributes
  `name`, `layout`, `num_classes` and `suggested`.
- `Layout`: the named tensors a task's flat float32 weight vector holds, in order.
- `Dataset`: features `X` (n, d) and targets `y` (n,), what `dataset` returns and `train` gets.
- `Evaluation`: what `evaluate` returns: loss, sample count, accuracy (and per class) or R².
- `TrainParams`: local training settings a task suggests (epochs, learning rate, batch size).
- `TorchTask`: a `Task` made of a torch model factory, a data function and a loss (or a `train`
  of your own); `fedasync.torch` also turns any `nn.Module` into the flat vector and back.

Code running on a device (docs/device-client.md; imports no torch):

- `DeviceClient`: the newest model (ETag, 304, long-poll), publishing through ingest (signed) or
  straight to Redis with retries under one update id, and receipts: what was decided about an
  update. `SyncDeviceClient`: the same, blocking, for code that is not asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedasync.shared import __version__

if TYPE_CHECKING:
    from fedasync.client import DeviceClient, SyncDeviceClient
    from fedasync.learning.dataset import Dataset
    from fedasync.learning.evaluation import Evaluation
    from fedasync.learning.task import Task, TrainParams
    from fedasync.shared.layout import Layout
    from fedasync.torch import TorchTask

#: where each public name lives: imported on first use (PEP 562), so that `import fedasync`, and
#: every `fedasync` command through it, does not pay for numpy, aiohttp and redis before it has
#: read its arguments (`fedasync --help` imports none of them)
_PUBLIC = {
    "DeviceClient": "fedasync.client",
    "SyncDeviceClient": "fedasync.client",
    "Dataset": "fedasync.learning.dataset",
    "Evaluation": "fedasync.learning.evaluation",
    "Task": "fedasync.learning.task",
    "TrainParams": "fedasync.learning.task",
    "Layout": "fedasync.shared.layout",
    "TorchTask": "fedasync.torch",  # imports torch only when used
}


#: the subpackages a user reaches as attributes (`import fedasync; fedasync.client.…`), as
#: they could when this module imported them eagerly
_SUBPACKAGES = frozenset({"client", "learning", "torch"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        value: Any = importlib.import_module(f"fedasync.{name}")  # binds it here as well
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        raise AttributeError(f"module 'fedasync' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | _SUBPACKAGES)


__all__ = [
    "Dataset",  # a labelled sample set
    "DeviceClient",  # code on a device: models, publishing, receipts (asyncio)
    "Evaluation",  # scores of one model on one data set
    "Layout",  # the named tensors of a flat weight vector
    "SyncDeviceClient",  # the device client, blocking
    "Task",  # a model and its data: the interface a task implements
    "TorchTask",  # a Task made of a torch model, its data and a loss
    "TrainParams",  # local training settings
    "__version__",
]
