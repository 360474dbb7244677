"""One entry of the updates stream: its field names, how an entry is built and how it is read.

An entry holds the msgpack update (`m`), or in claim-check mode its content address (`o`) with
the update in a store, and, when the device signed it, the signature: the
client id (`c`), the signing time in Unix milliseconds (`t`) and the hex HMAC (`s`). Every
writer (worker, ingest, tests, benchmarks) builds entries with `build` and every reader (the
aggregator, the ledger replay) reads them with `message_of` and `proof_of`, so the field names
are spelled here and nowhere else (docs/wire-format.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from fedasync.shared.device_auth import Proof, parse_proof

MESSAGE = "m"
CLIENT = "c"
SIGNED_AT = "t"
SIGNATURE = "s"
#: claim check: the content address of the message, which sits in a store instead of `m`
ADDRESS = "o"

Fields = Mapping[bytes, bytes]


def build(message: bytes, proof: Proof | None = None) -> dict[str, bytes | str]:
    """The fields of a new entry: the message and, if signed, the signature."""
    fields: dict[str, bytes | str] = {MESSAGE: message}
    if proof is not None:
        fields |= signature_fields(proof)
    return fields


def build_claim(address: str, proof: Proof | None = None) -> dict[str, bytes | str]:
    """The fields of a claim-check entry: the message's content address (the message is in the
    store, services/stores/claim_check.py) and, if signed, the signature over the message."""
    fields: dict[str, bytes | str] = {ADDRESS: address}
    if proof is not None:
        fields |= signature_fields(proof)
    return fields


def signature_fields(proof: Proof) -> dict[str, str]:
    """c, t and s of a signature, as written to the stream."""
    return {CLIENT: proof.client_id, SIGNED_AT: str(proof.signed_at_ms), SIGNATURE: proof.mac.hex()}


def message_of(fields: Fields | None) -> bytes | None:
    """The update's bytes; None when the entry has none (trimmed while pending, or foreign)."""
    return (fields or {}).get(MESSAGE.encode())


def address_of(fields: Fields | None) -> str | None:
    """The content address of a claim-check entry; None for an entry that carries its message
    (or an address that is not text, which the store then refuses as missing)."""
    value = (fields or {}).get(ADDRESS.encode())
    return None if value is None else value.decode("utf-8", "replace")


def proof_of(fields: Fields | None) -> Proof:
    """The signature fields as received (untrusted), parsed; AuthError if absent or malformed."""
    fields = fields or {}
    return parse_proof(
        fields.get(CLIENT.encode()), fields.get(SIGNED_AT.encode()), fields.get(SIGNATURE.encode())
    )
