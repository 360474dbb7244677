"""Proof that an update comes from the device it claims: an HMAC over the exact message bytes.

Every device holds its own secret key (32 random bytes, written as 64 hex characters). It signs

    b"fedasync-update-v1\\n" + client_id + b"\\n" + t + b"\\n" + message

with HMAC-SHA256, where `t` is the signing time in Unix milliseconds as decimal ASCII. The client id
is printable (no newline) and `t` is digits only, so the signed text is unambiguous. The proof
travels beside the message (stream fields `c`, `t`, `s`, or HTTP headers), never inside it, so the
wire format (docs/wire-format.md) is unchanged.

A request to *read* a receipt (`GET /v1/updates/<update id>` on the ingest service) is signed the
same way under its own domain tag, `b"fedasync-receipt-v1\\n"`, over `read_message(update_id)` =
`b"GET /v1/updates/" + update_id`. The two domain tags differ, so a read signature can never pass
as an update signature, nor the other way round.

A deployment trains several runs, each with its own device keys. A run other than the default
one signs under a domain that names it (`update_domain(run)`: `b"fedasync-update-v2\nrun=<id>\n"`,
and `read_domain(run)` for reads), so that a key given to two runs, or copied from one run's
table into another's, never lets a body signed for one run verify in the other. The default run
keeps the v1 domains: every device signed so before runs existed.

A device may instead hold an Ed25519 private key (`ed25519:<base64 of its 32-byte seed>`); Redis
then holds only its public key (`ed25519:<base64 of 32 bytes>`), so read access to Redis no longer
lets anyone forge that device's updates. Ed25519 is not a streaming signature, so what it signs is
the same head (domain, client id, time) followed by the SHA-256 digest of the message (32 bytes),
computed as the message streams in: `signature_base`. Its signature travels in the same field `s`,
as 128 hex characters rather than the MAC's 64. Which check applies is decided by the key stored
for the client, never by the signature: a 64-byte signature against an HMAC key is just wrong.

Pure: the key, the message and the current time are all passed in; nothing here reads a clock,
the network or Redis. The services decide *which* time is "now": the aggregator uses the time
Redis received the entry (its stream id), so a redelivery after an aggregator outage is judged
by when the device sent it, not by when the aggregator came back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from enum import StrEnum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedasync.shared.runs import DEFAULT_RUN, check_run_id
from fedasync.shared.update import MAX_ID_LENGTH

#: Domain separation: a MAC made for something else can never pass as an update signature.
DOMAIN = b"fedasync-update-v1\n"
#: The domain of a signed read (a receipt): never valid as an update signature, nor vice versa.
READ_DOMAIN = b"fedasync-receipt-v1\n"
#: What a read of a receipt signs, before the update id: the method and the route's path.
READ_PREFIX = b"GET /v1/updates/"
#: The domain of an update of a run other than the default one: DOMAIN_V2 + b"run=<id>\n".
DOMAIN_V2 = b"fedasync-update-v2\n"
#: The domain of a signed read of a receipt of a run other than the default one, likewise.
READ_DOMAIN_V2 = b"fedasync-receipt-v2\n"
KEY_BYTES = 32
#: Digits of a signing time, at most (Unix ms fits in 13 digits until the year 2286).
MAX_TIME_DIGITS = 15
SIGNATURE_HEX = 64
#: An Ed25519 signature's length in hex (64 bytes), the other length `s` may have.
ED25519_SIGNATURE_HEX = 128
#: The prefix of an Ed25519 key's text form (a device's private key, or the public key in Redis).
ED25519_PREFIX = "ed25519:"

#: What a device signs with: an HMAC key (32 bytes) or an Ed25519 private key.
SigningKey = bytes | Ed25519PrivateKey
#: What a verifier checks with: the same HMAC key, or the device's Ed25519 public key.
VerifyKey = bytes | Ed25519PublicKey


class AuthReason(StrEnum):
    """Why an update's proof of origin is refused; stable strings for dead letters and metrics."""

    #: no signature at all, while signatures are required
    UNSIGNED = "unsigned"
    #: some signature fields are there but unusable (not digits, not hex, bad client id)
    MALFORMED_SIGNATURE = "malformed_signature"
    #: no key is known for the claimed client (never added)
    UNKNOWN_DEVICE = "unknown_device"
    #: the client's key was revoked
    REVOKED = "revoked"
    #: the MAC does not match: forged, altered in transit, or signed with another key
    BAD_SIGNATURE = "bad_signature"
    #: a valid signature made too long before (or after) the update was received: a replay
    SIGNATURE_EXPIRED = "signature_expired"
    #: the message names a client other than the one whose key signed it
    CLIENT_MISMATCH = "client_mismatch"


class AuthError(ValueError):
    """A refused proof of origin, with a machine-readable reason and a human detail."""

    def __init__(self, reason: AuthReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}")


@dataclass(frozen=True, slots=True)
class Proof:
    """The signature fields, parsed: who signed, when (Unix ms), and the 32-byte MAC (or the
    64-byte Ed25519 signature: the field keeps its name)."""

    client_id: str
    signed_at_ms: int
    mac: bytes


def parse_key(text: str) -> bytes:
    """A key in its hex form → its bytes; ValueError if it is not 64 hex characters."""
    if len(text) != 2 * KEY_BYTES:
        raise ValueError(f"a device key is {2 * KEY_BYTES} hex characters, got {len(text)}")
    return bytes.fromhex(text)


def parse_signing_key(text: str) -> SigningKey:
    """A device's key as `fedasync devices add` printed it → what it signs with: 64 hex (HMAC,
    parsed exactly as `parse_key`) or `ed25519:<base64 seed>`; ValueError otherwise."""
    if text.startswith(ED25519_PREFIX):
        return Ed25519PrivateKey.from_private_bytes(_b64_32(text[len(ED25519_PREFIX) :]))
    return parse_key(text)


def parse_verify_key(text: str) -> VerifyKey:
    """A key as stored in Redis → what verifies with it: 64 hex (HMAC) or `ed25519:<base64
    public key>`; ValueError otherwise."""
    if text.startswith(ED25519_PREFIX):
        return Ed25519PublicKey.from_public_bytes(_b64_32(text[len(ED25519_PREFIX) :]))
    return parse_key(text)


def ed25519_texts(seed: bytes) -> tuple[str, str]:
    """The private key of a 32-byte seed as the device holds it, and its public key as Redis
    holds it: (`ed25519:<base64 seed>`, `ed25519:<base64 public>`). The caller draws the seed."""
    private = Ed25519PrivateKey.from_private_bytes(seed)
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return _ed25519_text(seed), _ed25519_text(public)


def _ed25519_text(raw: bytes) -> str:
    return ED25519_PREFIX + base64.b64encode(raw).decode("ascii")


def _b64_32(text: str) -> bytes:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("an ed25519 key is base64 after 'ed25519:'") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"an ed25519 key is {KEY_BYTES} bytes, got {len(raw)}")
    return raw


def _head(client_id: str, signed_at_ms: int, domain: bytes) -> bytes:
    return b"".join((domain, client_id.encode(), b"\n", str(signed_at_ms).encode(), b"\n"))


def signature_base(
    client_id: str, signed_at_ms: int, digest: bytes, domain: bytes = DOMAIN
) -> bytes:
    """What an Ed25519 key signs: the HMAC's head (domain, client id, time), then the SHA-256
    digest of the message, so that a body can be hashed while it streams in."""
    return _head(client_id, signed_at_ms, domain) + digest


class BodyCheck:
    """A signature check fed the message in pieces as they arrive, for either kind of key:
    an HMAC fed the bytes, or a SHA-256 of them for an Ed25519 signature base."""

    def __init__(
        self, key: VerifyKey, client_id: str, signed_at_ms: int, domain: bytes = DOMAIN
    ) -> None:
        self._key = key
        self._head = (client_id, signed_at_ms, domain)
        self._state = (
            signer(key, client_id, signed_at_ms, domain)
            if isinstance(key, bytes)
            else hashlib.sha256()
        )

    def update(self, chunk: bytes) -> None:
        """Feed the next piece of the message."""
        self._state.update(chunk)

    def check(self, proof: Proof, received_ms: int, window_ms: int) -> None:
        """`verify`, once the whole message was fed."""
        if isinstance(self._key, bytes):
            check_mac(proof, self._state.digest(), received_ms, window_ms)
            return
        client_id, signed_at_ms, domain = self._head
        base = signature_base(client_id, signed_at_ms, self._state.digest(), domain)
        try:
            self._key.verify(proof.mac, base)
        except InvalidSignature:
            raise AuthError(
                AuthReason.BAD_SIGNATURE,
                f"signature does not match the key of {proof.client_id}",
            ) from None
        check_time(proof, received_ms, window_ms)


def signer(key: bytes, client_id: str, signed_at_ms: int, domain: bytes = DOMAIN) -> hmac.HMAC:
    """The HMAC with the signed text's head (domain, client id, time) already fed: feed it the
    message in pieces as they arrive (ingest, a body while it streams in), so that checking a
    MAC never needs the whole message in memory first. `.digest()` is then `mac(...)`."""
    return hmac.new(key, _head(client_id, signed_at_ms, domain), hashlib.sha256)


def mac(
    key: bytes, client_id: str, signed_at_ms: int, message: bytes, domain: bytes = DOMAIN
) -> bytes:
    """HMAC-SHA256 over the domain, the client id, the signing time and the exact message."""
    state = signer(key, client_id, signed_at_ms, domain)
    state.update(message)
    return state.digest()


def sign(
    key: SigningKey, client_id: str, signed_at_ms: int, message: bytes, domain: bytes = DOMAIN
) -> Proof:
    """The device's signature over `message`: who, when (Unix ms) and the MAC (HMAC key) or the
    Ed25519 signature of `signature_base` (Ed25519 key)."""
    check_client_id(client_id)
    if isinstance(key, bytes):
        return Proof(client_id, signed_at_ms, mac(key, client_id, signed_at_ms, message, domain))
    digest = hashlib.sha256(message).digest()
    return Proof(
        client_id, signed_at_ms, key.sign(signature_base(client_id, signed_at_ms, digest, domain))
    )


def update_domain(run: str | None) -> bytes:
    """The domain an update of `run` is signed under: DOMAIN for the default run (None, or the
    id `fedasync`: every device signed so before runs existed), else
    `b"fedasync-update-v2\nrun=<id>\n"`. The run is in the signed text, so a body signed for one
    run never verifies in another, even where a device holds the same key in both."""
    return _run_domain(run, DOMAIN, DOMAIN_V2)


def read_domain(run: str | None) -> bytes:
    """The domain a read of a receipt of `run` is signed under: READ_DOMAIN for the default
    run, else `b"fedasync-receipt-v2\nrun=<id>\n"` (as `update_domain`)."""
    return _run_domain(run, READ_DOMAIN, READ_DOMAIN_V2)


def _run_domain(run: str | None, legacy: bytes, named: bytes) -> bytes:
    if run is None or run == DEFAULT_RUN:
        return legacy
    return named + b"run=" + check_run_id(run).encode("ascii") + b"\n"


def read_message(update_id: str) -> bytes:
    """What a read of the receipt of `update_id` signs (under READ_DOMAIN): method and path,
    with the update id as it is, not percent-encoded."""
    return READ_PREFIX + update_id.encode()


def check_client_id(client_id: str) -> None:
    """The same rule as the wire format's client_id: 1..128 printable characters."""
    if not 1 <= len(client_id) <= MAX_ID_LENGTH or not client_id.isprintable():
        raise AuthError(
            AuthReason.MALFORMED_SIGNATURE,
            f"client id must be 1..{MAX_ID_LENGTH} printable characters",
        )


def parse_proof(client: bytes | None, signed_at: bytes | None, signature: bytes | None) -> Proof:
    """Signature fields as received (bytes, untrusted) → Proof, or AuthError.

    All three absent is UNSIGNED; some but not all, or any that is not well formed, is
    MALFORMED_SIGNATURE. Nothing is trusted yet: the MAC is checked by `verify`.
    """
    if client is None and signed_at is None and signature is None:
        raise AuthError(AuthReason.UNSIGNED, "no signature")
    if client is None or signed_at is None or signature is None:
        raise AuthError(AuthReason.MALFORMED_SIGNATURE, "c, t and s must come together")
    try:
        client_id = client.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthError(AuthReason.MALFORMED_SIGNATURE, "client id is not UTF-8") from None
    check_client_id(client_id)
    if not (1 <= len(signed_at) <= MAX_TIME_DIGITS and signed_at.isdigit()):
        raise AuthError(
            AuthReason.MALFORMED_SIGNATURE, f"t must be 1..{MAX_TIME_DIGITS} decimal digits"
        )
    if len(signature) not in (SIGNATURE_HEX, ED25519_SIGNATURE_HEX) or not _is_lower_hex(signature):
        raise AuthError(
            AuthReason.MALFORMED_SIGNATURE,
            f"s must be {SIGNATURE_HEX} (HMAC) or {ED25519_SIGNATURE_HEX} (Ed25519) lowercase "
            "hex digits",
        )
    return Proof(client_id, int(signed_at), bytes.fromhex(signature.decode("ascii")))


def verify(
    proof: Proof,
    key: VerifyKey,
    message: bytes,
    received_ms: int,
    window_ms: int,
    domain: bytes = DOMAIN,
) -> None:
    """Check the MAC (constant time), then the signing time against the time of receipt.

    The MAC comes first, so a forgery is always reported as such whatever time it claims. A
    signature made more than `window_ms` before or after `received_ms` is refused: a replay of
    a captured update outside the window, or a device whose clock is far off.
    """
    check = BodyCheck(key, proof.client_id, proof.signed_at_ms, domain)
    check.update(message)
    check.check(proof, received_ms, window_ms)


def check_mac(proof: Proof, expected: bytes, received_ms: int, window_ms: int) -> None:
    """`verify` once the MAC of the message is computed (`expected`, e.g. from a `signer` fed
    while the message was read): the MAC in constant time, then the signing time."""
    if not hmac.compare_digest(expected, proof.mac):
        raise AuthError(
            AuthReason.BAD_SIGNATURE, f"MAC does not match the key of {proof.client_id}"
        )
    check_time(proof, received_ms, window_ms)


def check_time(proof: Proof, received_ms: int, window_ms: int) -> None:
    """The signing time against the time of receipt (once the signature itself held)."""
    skew = received_ms - proof.signed_at_ms
    if abs(skew) > window_ms:
        when = "before" if skew > 0 else "after"
        raise AuthError(
            AuthReason.SIGNATURE_EXPIRED,
            f"signed {abs(skew)} ms {when} it was received; window {window_ms} ms (t is "
            "milliseconds since the Unix epoch)",
        )


def check_claim(proof: Proof, claimed_client_id: str) -> None:
    """The client id inside the message must be the one whose key signed it."""
    if claimed_client_id != proof.client_id:
        raise AuthError(
            AuthReason.CLIENT_MISMATCH,
            f"message claims client {claimed_client_id!r}, signed by {proof.client_id!r}",
        )


def stream_id_ms(stream_id: bytes) -> int:
    """The millisecond part of a Redis stream entry id (b"1700000000000-3" → 1700000000000)."""
    return int(stream_id.split(b"-", 1)[0])


def _is_lower_hex(value: bytes) -> bool:
    return all(c in b"0123456789abcdef" for c in value)
