"""The proof of origin (shared/device_auth.py) and the token bucket, without Redis or clocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fedasync.shared.device_auth import (
    DOMAIN,
    READ_DOMAIN,
    AuthError,
    AuthReason,
    check_claim,
    check_mac,
    mac,
    parse_key,
    parse_proof,
    read_domain,
    read_message,
    sign,
    signer,
    stream_id_ms,
    update_domain,
    verify,
)
from fedasync.shared.runs import RunIdError
from fedasync.shared.token_bucket import TokenBucket

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
MESSAGE = b"\x81\xa1a\x01"
T = 1_764_489_600_000
WINDOW = 300_000


def refusal(call: Callable[[], object]) -> AuthReason:
    with pytest.raises(AuthError) as info:
        call()
    return info.value.reason


def test_a_signature_verifies_with_its_key_at_receipt_time() -> None:
    signed = sign(KEY, "dev-7", T, MESSAGE)
    proof = parse_proof(b"dev-7", str(T).encode(), signed.mac.hex().encode())
    assert proof == signed
    verify(proof, KEY, MESSAGE, received_ms=T + 1, window_ms=WINDOW)
    check_claim(proof, "dev-7")


def test_the_mac_is_hmac_sha256_over_domain_client_time_message() -> None:
    import hashlib
    import hmac

    text = b"fedasync-update-v1\ndev-7\n" + str(T).encode() + b"\n" + MESSAGE
    assert mac(KEY, "dev-7", T, MESSAGE) == hmac.new(KEY, text, hashlib.sha256).digest()


@pytest.mark.parametrize("piece", [1, 3, 64, 10_000])
def test_a_mac_fed_in_pieces_is_the_mac_of_the_whole(piece: int) -> None:
    """Ingest feeds a body to the MAC as it streams in: the same MAC, the same wire format."""
    message = bytes(range(256)) * 20
    state = signer(KEY, "dev-7", T)
    for start in range(0, len(message), piece):
        state.update(message[start : start + piece])
    assert state.digest() == mac(KEY, "dev-7", T, message)
    proof = sign(KEY, "dev-7", T, message)
    check_mac(proof, state.digest(), T, WINDOW)
    assert refusal(lambda: check_mac(proof, signer(KEY, "dev-7", T).digest(), T, WINDOW)) == (
        AuthReason.BAD_SIGNATURE
    )


def test_a_receipt_read_signs_method_path_and_id_under_its_own_domain() -> None:
    import hashlib
    import hmac

    text = b"fedasync-receipt-v1\ndev-7\n" + str(T).encode() + b"\nGET /v1/updates/u-1"
    signed = sign(KEY, "dev-7", T, read_message("u-1"), READ_DOMAIN)
    assert signed.mac == hmac.new(KEY, text, hashlib.sha256).digest()
    verify(signed, KEY, read_message("u-1"), T, WINDOW, READ_DOMAIN)
    other = read_message("u-2")
    assert refusal(lambda: verify(signed, KEY, other, T, WINDOW, READ_DOMAIN)) is (
        AuthReason.BAD_SIGNATURE
    )


@pytest.mark.parametrize("message", [MESSAGE, read_message("u-1")])
def test_a_read_signature_never_passes_as_an_update_signature(message: bytes) -> None:
    """Same key, client, time and bytes: the domain tags alone keep the two apart, both ways."""
    as_read = sign(KEY, "dev-7", T, message, READ_DOMAIN)
    as_update = sign(KEY, "dev-7", T, message, DOMAIN)
    assert refusal(lambda: verify(as_read, KEY, message, T, WINDOW)) is AuthReason.BAD_SIGNATURE
    assert refusal(lambda: verify(as_update, KEY, message, T, WINDOW, READ_DOMAIN)) is (
        AuthReason.BAD_SIGNATURE
    )


@pytest.mark.parametrize(
    ("client", "signed_at", "message", "key"),
    [
        ("dev-8", T, MESSAGE, KEY),  # claims another device
        ("dev-7", T + 1, MESSAGE, KEY),  # time altered
        ("dev-7", T, MESSAGE + b"x", KEY),  # message altered
        ("dev-7", T, MESSAGE, OTHER_KEY),  # someone else's key
    ],
)
def test_anything_altered_is_a_bad_signature(
    client: str, signed_at: int, message: bytes, key: bytes
) -> None:
    good = sign(KEY, "dev-7", T, MESSAGE).mac.hex()
    proof = parse_proof(client.encode(), str(signed_at).encode(), good.encode())
    reason = refusal(lambda: verify(proof, key, message, T, WINDOW))
    assert reason is AuthReason.BAD_SIGNATURE


@pytest.mark.parametrize("received", [T + WINDOW + 1, T - WINDOW - 1])
def test_a_signature_outside_the_window_is_expired(received: int) -> None:
    proof = parse_proof(
        b"dev-7", str(T).encode(), sign(KEY, "dev-7", T, MESSAGE).mac.hex().encode()
    )
    reason = refusal(lambda: verify(proof, KEY, MESSAGE, received, WINDOW))
    assert reason is AuthReason.SIGNATURE_EXPIRED


@pytest.mark.parametrize("received", [T + WINDOW, T - WINDOW])
def test_the_window_edges_are_inside(received: int) -> None:
    proof = parse_proof(
        b"dev-7", str(T).encode(), sign(KEY, "dev-7", T, MESSAGE).mac.hex().encode()
    )
    verify(proof, KEY, MESSAGE, received, WINDOW)


def test_a_forgery_is_reported_as_forged_even_with_an_old_time() -> None:
    proof = parse_proof(b"dev-7", b"1", b"0" * 64)
    assert refusal(lambda: verify(proof, KEY, MESSAGE, T, WINDOW)) is AuthReason.BAD_SIGNATURE


def test_no_fields_is_unsigned() -> None:
    assert refusal(lambda: parse_proof(None, None, None)) is AuthReason.UNSIGNED


@pytest.mark.parametrize(
    ("client", "signed_at", "signature"),
    [
        (b"dev-7", None, b"0" * 64),
        (None, b"1", b"0" * 64),
        (b"dev-7", b"1", None),
        (b"", b"1", b"0" * 64),
        (b"dev\n7", b"1", b"0" * 64),
        (b"\xff", b"1", b"0" * 64),
        (b"x" * 129, b"1", b"0" * 64),
        (b"dev-7", b"-1", b"0" * 64),
        (b"dev-7", b"1.5", b"0" * 64),
        (b"dev-7", b"", b"0" * 64),
        (b"dev-7", b"1" * 16, b"0" * 64),
        (b"dev-7", b"1", b"0" * 63),
        (b"dev-7", b"1", b"A" * 64),
        (b"dev-7", b"1", b"g" * 64),
    ],
)
def test_malformed_fields_are_refused_before_any_mac(
    client: bytes | None, signed_at: bytes | None, signature: bytes | None
) -> None:
    reason = refusal(lambda: parse_proof(client, signed_at, signature))
    assert reason is AuthReason.MALFORMED_SIGNATURE


def test_the_message_must_claim_the_signer() -> None:
    proof = parse_proof(b"dev-7", b"1", b"0" * 64)
    assert refusal(lambda: check_claim(proof, "dev-8")) is AuthReason.CLIENT_MISMATCH


def test_keys_are_64_hex_characters() -> None:
    assert parse_key("ab" * 32) == b"\xab" * 32
    with pytest.raises(ValueError, match="64 hex"):
        parse_key("ab" * 31)
    with pytest.raises(ValueError, match="non-hexadecimal"):
        parse_key("zz" * 32)


def test_stream_id_ms_is_the_time_redis_received_the_entry() -> None:
    assert stream_id_ms(b"1764489600123-7") == 1_764_489_600_123


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.wait(0.0) == pytest.approx(0.5)
    assert bucket.take(0.0) == pytest.approx(0.5)  # refused: half a second until a token
    assert bucket.take(0.5) == 0.0
    assert not bucket.is_full(0.5)
    assert bucket.is_full(10.0)
    assert bucket.tokens == 3  # never more than the burst


def test_a_named_run_signs_under_a_domain_that_names_it() -> None:
    assert update_domain(None) == update_domain("fedasync") == DOMAIN
    assert read_domain(None) == read_domain("fedasync") == READ_DOMAIN
    assert update_domain("run-a") == b"fedasync-update-v2\nrun=run-a\n"
    assert read_domain("run-a") == b"fedasync-receipt-v2\nrun=run-a\n"
    key = bytes(range(32))
    body = b"the same body"
    signed_for_a = sign(key, "dev", 1_000, body, update_domain("run-a"))
    verify(signed_for_a, key, body, 1_000, 10, update_domain("run-a"))
    for elsewhere in ("run-b", None):
        with pytest.raises(AuthError) as refused:
            verify(signed_for_a, key, body, 1_000, 10, update_domain(elsewhere))
        assert refused.value.reason is AuthReason.BAD_SIGNATURE
    with pytest.raises(RunIdError):
        update_domain("Not a run\n")
