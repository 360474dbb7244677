"""Prometheus metrics of the ingest service: what was accepted, every refusal by reason, and the
receipts read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_SIZE_BUCKETS = (1e3, 1e4, 1e5, 1e6, 4e6, 16e6, 64e6)


class IngestMetrics:
    """One registry per app (tests run several in one process)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.accepted = Counter(
            "fedasync_ingest_accepted",
            "Updates answered 202, by kind: new (added to the stream) or retry (already there)",
            ["kind"],
            registry=r,
        )
        self.refusals = Counter(
            "fedasync_ingest_refusals",
            "Requests refused (POST /v1/updates, GET /v1/updates/{update_id}), by reason",
            ["reason"],
            registry=r,
        )
        self.receipts = Counter(
            "fedasync_ingest_receipts",
            "Receipts answered to GET /v1/updates/{update_id}, by outcome (or not_decided)",
            ["answer"],
            registry=r,
        )
        self.body_bytes = Histogram(
            "fedasync_ingest_body_bytes",
            "Size of accepted update bodies",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
