"""fedasync: asynchronous federated learning over Redis Streams.

The one import name of the distribution. The repository keeps its parts at its top (`shared/` the
pure core, `services/` the services, `learning/` the tasks, `sim/` the simulator); each is a
subpackage here (`fedasync.shared`, ...), linked into this folder, so the installed wheel holds
`fedasync` and nothing else at the top of site-packages. The public API is what this module
exports; everything under the subpackages is internal and may change between versions.

- `DeviceClient`, `SyncDeviceClient`: the device client (`fedasync.client`, docs/device-client.md):
  the newest model, publishing with retries under one update id, and receipts. No torch.
"""

from __future__ import annotations

from fedasync.client import DeviceClient, SyncDeviceClient
from fedasync.shared import __version__

__all__ = [
    "DeviceClient",  # code on a device: models, publishing, receipts (asyncio)
    "SyncDeviceClient",  # the same, blocking
    "__version__",
]
