"""The ingest service's wire contract: paths, media type, signature headers, and the reasons of
the answers a device acts on.

Shared by the service and the device client (fedasync.client), so both sides spell them the same
way (docs/http-api.md); here, in the core, so the client needs nothing of the service to speak it.
"""

from __future__ import annotations

from urllib.parse import quote

from fedasync.shared.device_auth import (
    SigningKey,
    read_domain,
    read_message,
    sign,
    update_domain,
)
from fedasync.shared.runs import run_path

PATH = "/v1/updates"
#: the receipt of one update: GET, signed, no body
RECEIPT_PATH = PATH + "/{update_id}"
CONTENT_TYPE = "application/vnd.fedasync.update+msgpack"
CLIENT_HEADER = "X-Fedasync-Client"
TIME_HEADER = "X-Fedasync-Time"
SIGNATURE_HEADER = "X-Fedasync-Signature"

#: the 404 of a receipt: no decision is recorded for this device's update id (yet)
NOT_DECIDED = "not_decided"
#: the 503 while the operators have paused ingest (the policy's `ingest_paused`)
INGEST_PAUSED = "ingest_paused"
#: the 503 while Redis is full (`maxmemory`): the update was refused whole, nothing added
REDIS_OUT_OF_MEMORY = "redis_out_of_memory"
#: the 503 while other uploads hold the budget of unverified bytes (services/ingest/budget.py)
UNVERIFIED_BUDGET = "unverified_budget"
#: the 409 of an update for a run that finished training: no aggregator will decide it
RUN_DONE = "run_done"


def signed_headers(
    key: SigningKey, client_id: str, signed_at_ms: int, body: bytes, run: str | None = None
) -> dict[str, str]:
    """The headers of a POST of `body` to `run`'s route (None: the legacy route): media type
    and the device's signature over the body, under the run's domain (update_domain)."""
    proof = sign(key, client_id, signed_at_ms, body, update_domain(run))
    return {
        "Content-Type": CONTENT_TYPE,
        CLIENT_HEADER: proof.client_id,
        TIME_HEADER: str(proof.signed_at_ms),
        SIGNATURE_HEADER: proof.mac.hex(),
    }


def updates_path(run: str | None = None) -> str:
    """Where a device POSTs its updates: the legacy `/v1/updates` for run None (the default
    run), `/v1/runs/<run>/updates` for a named run."""
    return run_path(run, PATH)


def receipt_path(update_id: str, run: str | None = None) -> str:
    """The path of an update's receipt, the id percent-encoded (a `/` in it stays one segment),
    under `run`'s routes when one is named."""
    return f"{updates_path(run)}/{quote(update_id, safe='')}"


def read_headers(
    key: SigningKey, client_id: str, signed_at_ms: int, update_id: str, run: str | None = None
) -> dict[str, str]:
    """The headers of a GET of the receipt of `update_id` of `run` (None: the legacy route):
    the device's signature over `GET /v1/updates/<update id>` (the id decoded, the same text
    for every run) under the run's read domain (read_domain)."""
    proof = sign(key, client_id, signed_at_ms, read_message(update_id), read_domain(run))
    return {
        CLIENT_HEADER: proof.client_id,
        TIME_HEADER: str(proof.signed_at_ms),
        SIGNATURE_HEADER: proof.mac.hex(),
    }
