"""Every Redis name fedasync uses: defined in the core (fedasync.shared.keys), which the device
client shares; imported from here by the services and their tests."""

from __future__ import annotations

from fedasync.shared.keys import AGGREGATOR_GROUP, Keys, update_digest

__all__ = ["AGGREGATOR_GROUP", "Keys", "update_digest"]
