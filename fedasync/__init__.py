"""fedasync: asynchronous federated learning over Redis Streams.

The one import name of the distribution. The repository keeps its parts at its top (`shared/` the
pure core, `services/` the services, `learning/` the tasks, `sim/` the simulator); each is a
subpackage here (`fedasync.shared`, ...), linked into this folder, so the installed wheel holds
`fedasync` and nothing else at the top of site-packages. The public API is what this module
exports; everything under the subpackages is internal and may change between versions.
"""

from __future__ import annotations

from fedasync.shared import __version__
from fedasync.torch import TorchTask  # a Task from a torch model; imports torch only when used

__all__ = ["TorchTask", "__version__"]
