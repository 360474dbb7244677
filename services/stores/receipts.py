"""Receipts: which decision one device's update got, looked up by (client id, update id).

The index (`{p}:receipts`, written by the aggregator's commit script in the same atomic step as
the ledger entry it names: services/aggregator/commit.py) is read in one place, which the device
client shares: fedasync.client.receipt_index, where its layout is described. The ingest service
and the tests look receipts up through here.
"""

from __future__ import annotations

from fedasync.client.receipt_index import lookup

__all__ = ["lookup"]
