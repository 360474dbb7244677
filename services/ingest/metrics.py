"""Prometheus metrics of the ingest service: what was accepted, every refusal by reason, the
receipts read, and the bodies read before their signature was checked."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.unverified_bytes = Gauge(
            "fedasync_ingest_unverified_bytes",
            "Bytes reserved by bodies being read whose signature is not yet checked "
            "(FEDASYNC_INGEST__UNVERIFIED_BYTES bounds it)",
            registry=r,
        )
        self.read_bytes = Counter(
            "fedasync_ingest_read_bytes",
            "Bytes of update bodies read, before their signature was checked (accepted or not)",
            registry=r,
        )
        self.runs = Gauge(
            "fedasync_ingest_runs",
            "Runs this process serves (each made at its first request; "
            "FEDASYNC_INGEST__MAX_RUNS bounds it)",
            registry=r,
        )
        self.runs_refused = Counter(
            "fedasync_ingest_runs_refused",
            "Requests for a run beyond FEDASYNC_INGEST__MAX_RUNS, refused with 503 too_many_runs",
            registry=r,
        )
        self.body_limit_bytes = Gauge(
            "fedasync_ingest_body_limit_bytes",
            "The body limit in force: FEDASYNC_INGEST__MAX_BODY_BYTES, or the largest update of "
            "the run's model",
            registry=r,
        )
