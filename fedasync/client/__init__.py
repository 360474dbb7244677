"""The device client: what code running on a device uses to take part in training.

`DeviceClient` (asyncio) and `SyncDeviceClient` (blocking) download the newest model (ETag,
`304`, long-poll), publish updates (through the ingest service, signed with the device key, or
straight to Redis on a trusted network), retrying transient failures with one update id, and read
the receipt of each update: the decision the aggregator recorded for it. docs/device-client.md.
"""

from __future__ import annotations

from fedasync.client.device import DeviceClient
from fedasync.client.errors import Abandoned, ClientError, Refused, Unavailable, UnexpectedAnswer
from fedasync.client.models import Downloads, Model
from fedasync.client.publishing import PreparedUpdate, Published
from fedasync.client.receipts import Receipt
from fedasync.client.retry import RetryPolicy
from fedasync.client.sync import SyncDeviceClient
from fedasync.shared.decision import Decision, Outcome

__all__ = [
    "Abandoned",
    "ClientError",
    "Decision",
    "DeviceClient",
    "Downloads",
    "Model",
    "Outcome",
    "PreparedUpdate",
    "Published",
    "Receipt",
    "Refused",
    "RetryPolicy",
    "SyncDeviceClient",
    "Unavailable",
    "UnexpectedAnswer",
]
