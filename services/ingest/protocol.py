"""What a device sends to the ingest service: path, media type and signature headers.

Shared by the service and the worker, so both sides spell them the same way (docs/http-api.md).
"""

from __future__ import annotations

from fedasync.shared.device_auth import sign

PATH = "/v1/updates"
CONTENT_TYPE = "application/vnd.fedasync.update+msgpack"
CLIENT_HEADER = "X-Fedasync-Client"
TIME_HEADER = "X-Fedasync-Time"
SIGNATURE_HEADER = "X-Fedasync-Signature"


def signed_headers(key: bytes, client_id: str, signed_at_ms: int, body: bytes) -> dict[str, str]:
    """The headers of a POST of `body`: media type and the device's signature over the body."""
    proof = sign(key, client_id, signed_at_ms, body)
    return {
        "Content-Type": CONTENT_TYPE,
        CLIENT_HEADER: proof.client_id,
        TIME_HEADER: str(proof.signed_at_ms),
        SIGNATURE_HEADER: proof.mac.hex(),
    }
