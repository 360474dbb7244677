"""Ed25519 in the core: key texts, the signature base, and one check for both kinds of key."""

from __future__ import annotations

import hashlib

import pytest

from fedasync.shared.device_auth import (
    DOMAIN,
    READ_DOMAIN,
    AuthError,
    AuthReason,
    BodyCheck,
    ed25519_texts,
    parse_key,
    parse_signing_key,
    parse_verify_key,
    sign,
    signature_base,
    verify,
)

SEED = bytes(range(32))
NOW = 1_700_000_000_000


def test_key_texts_say_their_kind_and_hmac_keys_parse_as_before() -> None:
    private, public = ed25519_texts(SEED)
    assert private.startswith("ed25519:")
    assert public.startswith("ed25519:")
    assert private != public
    hmac_text = "ab" * 32
    assert parse_signing_key(hmac_text) == parse_key(hmac_text) == bytes.fromhex(hmac_text)
    assert parse_verify_key(hmac_text) == bytes.fromhex(hmac_text)
    for bad in ("ed25519:", "ed25519:!!!!", "ed25519:" + "QUJD", "ab" * 31):
        with pytest.raises(ValueError, match="key"):
            parse_signing_key(bad)


def test_an_ed25519_signature_verifies_with_the_public_key_only_over_its_base() -> None:
    private, public = ed25519_texts(SEED)
    key, verify_key = parse_signing_key(private), parse_verify_key(public)
    message = b"the update's bytes"
    proof = sign(key, "dev", NOW, message)
    assert len(proof.mac) == 64
    digest = hashlib.sha256(message).digest()
    assert (
        signature_base("dev", NOW, digest) == DOMAIN + b"dev\n" + str(NOW).encode() + b"\n" + digest
    )
    verify(proof, verify_key, message, NOW, 1000)
    check = BodyCheck(verify_key, "dev", NOW)
    for piece in (message[:5], message[5:]):  # fed as the body streams in
        check.update(piece)
    check.check(proof, NOW, 1000)
    with pytest.raises(AuthError) as refused:
        verify(proof, verify_key, message + b"!", NOW, 1000)
    assert refused.value.reason is AuthReason.BAD_SIGNATURE
    with pytest.raises(AuthError) as refused:
        verify(proof, verify_key, message, NOW, 1000, READ_DOMAIN)
    assert refused.value.reason is AuthReason.BAD_SIGNATURE
    with pytest.raises(AuthError) as refused:
        verify(proof, verify_key, message, NOW + 5000, 1000)
    assert refused.value.reason is AuthReason.SIGNATURE_EXPIRED
    with pytest.raises(AuthError) as refused:  # the Ed25519 signature against an HMAC key
        verify(proof, SEED, message, NOW, 1000)
    assert refused.value.reason is AuthReason.BAD_SIGNATURE
