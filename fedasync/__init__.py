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
"""

from __future__ import annotations

from fedasync.learning.dataset import Dataset
from fedasync.learning.evaluation import Evaluation
from fedasync.learning.task import Task, TrainParams
from fedasync.shared import __version__
from fedasync.shared.layout import Layout
from fedasync.torch import TorchTask  # a Task from a torch model; imports torch only when used

__all__ = [
    "Dataset",  # a labelled sample set
    "Evaluation",  # scores of one model on one data set
    "Layout",  # the named tensors of a flat weight vector
    "Task",  # a model and its data: the interface a task implements
    "TorchTask",  # a Task made of a torch model, its data and a loss
    "TrainParams",  # local training settings
    "__version__",
]
