"""A ledger entry as a record: how the decision the commit wrote reads back, and whose it is.

The commit writes each decision as one entry of the ledger stream, its record (the decision's
fields, plus where and when) packed in the field `d`. The services (services/stores/ledger.py)
and a device reading its receipt from Redis (fedasync.client.receipt_index) read it back the same
way, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

#: the field of a ledger entry holding its record (msgpack)
FIELD = b"d"


def decode(entry_id: str, fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The record of the ledger entry `entry_id`, with that id as its `ledger_id`."""
    record: dict[str, Any] = msgpack.unpackb(fields[FIELD], raw=False)
    record["ledger_id"] = entry_id
    return record


def is_about(record: Mapping[str, Any], client_id: str, update_id: str) -> bool:
    """The record is a decision about this device's update (not another's)."""
    return (record["client_id"], record["update_id"]) == (client_id, update_id)
