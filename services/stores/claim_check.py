"""Claim check: the update's bytes in a directory store, the stream carrying only their address.

A publisher puts the update message (the same msgpack bytes as ever) in the store under its
SHA-256 and XADDs an entry with the content address (`o` = `sha256:<hex>`, shared/stream_entry.py)
and, when signed, the signature over those bytes. Redis then carries about a hundred bytes an
update, whatever the model's size. The aggregator fetches the objects of a whole read ahead of
deciding it, in a worker thread, and checks each against its address: an object that is missing
or whose bytes do not hash to it is a rejection with its reason (`claim_missing`,
`claim_mismatch`: a dead letter and `fedasync_aggregator_rejections_total{reason}`), exactly as
a malformed message is. `ledger verify` reads the same objects, so they must be kept as long as
the ledger (the store is the audit, as the archive is for in-stream payloads).

The store is a directory, which may be on a shared filesystem all publishers and the aggregator
mount (FEDASYNC_WIRE__CLAIM_CHECK_DIR): objects under `<hex[:2]>/<hex>`, written to a temporary
name, fsynced and renamed, so a reader sees a whole object or none.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

PREFIX = "sha256:"


class ClaimError(ValueError):
    """An address that names no object here, or an object whose bytes do not match it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def address_of(message: bytes) -> str:
    """The content address of `message`."""
    return PREFIX + hashlib.sha256(message).hexdigest()


class ClaimStore:
    """A content-addressed directory of update messages."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, address: str) -> Path | None:
        digest = address.removeprefix(PREFIX)
        if not address.startswith(PREFIX) or len(digest) != 64 or not _is_hex(digest):
            return None
        return self.root / digest[:2] / digest

    def put(self, message: bytes) -> str:
        """Store `message` durably (once: an object already there is the same bytes)."""
        address = address_of(message)
        path = self._path(address)
        assert path is not None
        if path.exists():
            return address
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        with partial.open("wb") as out:
            out.write(message)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
        return address

    def get(self, address: str) -> bytes:
        """The object at `address`, checked against it; ClaimError if missing or mismatched."""
        path = self._path(address)
        if path is None:
            raise ClaimError("claim_missing", f"{address[:80]!r} is not a sha256 content address")
        try:
            message = path.read_bytes()
        except FileNotFoundError:
            raise ClaimError("claim_missing", f"no object {address} in the store") from None
        if address_of(message) != address:
            raise ClaimError("claim_mismatch", f"the object stored as {address} has other bytes")
        return message

    def fetch(self, addresses: Iterable[str]) -> dict[str, bytes | ClaimError]:
        """Each address's object or its error (blocking: run in a worker thread; hashing
        releases the GIL)."""
        found: dict[str, bytes | ClaimError] = {}
        for address in addresses:
            try:
                found[address] = self.get(address)
            except ClaimError as exc:
                found[address] = exc
        return found


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
