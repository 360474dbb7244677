"""The payload archive: the update payloads `ledger verify` needs, kept out of Redis.

With an archive directory set (FEDASYNC_AGGREGATOR__ARCHIVE_DIR), the aggregator writes the
payload of every update its next commit records in the ledger to one segment file, made durable
(written, fsynced, renamed into place, directory fsynced) *before* that commit, and trims the
payloads from the updates stream once the commit landed. So Redis holds only what is not decided
yet, whatever the run's length, and every committed decision has its payload on disk.

A segment is a run of records `u16 id length, stream id, u64 payload length, payload`, named
after its first and last stream ids. An aggregator killed between a segment and its commit leaves
a segment no decision names; the entries are decided again and archived again, byte for byte the
same (the payload is the stream entry's), so a stream id found twice holds the same bytes.

A claim-check update's message already sits in its content-addressed store
(services/stores/claim_check.py): the archive keeps only its address, marked with ADDRESS_MARK
(`@`, a byte no update message starts with: a message is a msgpack map).

The directory may be on a shared filesystem; each key prefix (training run) has its own folder.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

_ID = struct.Struct(">H")
_LENGTH = struct.Struct(">Q")
SUFFIX = ".seg"
#: first byte of an archived content address, in place of a message (claim check)
ADDRESS_MARK = b"@"


class ArchiveError(RuntimeError):
    """A segment that cannot be read as this module writes them (cut short, or not ours)."""


def run_folder(root: Path, key_prefix: str) -> Path:
    """The archive folder of one training run: the key prefix, made a safe file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else f"%{ord(c):02x}" for c in key_prefix)
    return root / (safe or "%")


class PayloadArchive:
    """Segments of (stream id, payload) under one run's folder."""

    def __init__(self, root: Path, key_prefix: str) -> None:
        self.folder = run_folder(root, key_prefix)
        self._index: dict[str, tuple[Path, int, int]] | None = None

    def write(self, entries: Sequence[tuple[bytes, bytes]]) -> Path | None:
        """Make `entries` (stream id, payload) durable as one segment; None if there are none.

        Blocking file I/O: the aggregator runs it in a worker thread, beside its Redis work.
        """
        if not entries:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        first, last = entries[0][0].decode(), entries[-1][0].decode()
        path = self.folder / f"{first}_{last}{SUFFIX}"
        partial = path.with_suffix(".part")
        with partial.open("wb") as out:
            for stream_id, payload in entries:
                out.write(_ID.pack(len(stream_id)))
                out.write(stream_id)
                out.write(_LENGTH.pack(len(payload)))
                out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
        directory = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._index = None
        return path

    def read(self, stream_id: str) -> bytes | None:
        """The archived payload of `stream_id`, None if no segment holds it."""
        if self._index is None:
            self._index = dict(self._scan())
        found = self._index.get(stream_id)
        if found is None:
            return None
        path, offset, length = found
        with path.open("rb") as segment:
            segment.seek(offset)
            payload = segment.read(length)
        if len(payload) != length:
            raise ArchiveError(f"{path}: cut short at {stream_id}")
        return payload

    def segments(self) -> list[Path]:
        """The segment files, oldest first (names start with their first stream id)."""
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob(f"*{SUFFIX}"), key=lambda p: _order(p.name.split("_")[0]))

    def _scan(self) -> Iterator[tuple[str, tuple[Path, int, int]]]:
        """(stream id, where its payload is) for every record of every segment; headers only."""
        for path in self.segments():
            size = path.stat().st_size
            with path.open("rb") as segment:
                offset = 0
                while offset < size:
                    header = segment.read(_ID.size)
                    if len(header) != _ID.size:
                        raise ArchiveError(f"{path}: cut short at byte {offset}")
                    (id_length,) = _ID.unpack(header)
                    stream_id = segment.read(id_length).decode()
                    (length,) = _LENGTH.unpack(segment.read(_LENGTH.size))
                    start = offset + _ID.size + id_length + _LENGTH.size
                    if start + length > size:
                        raise ArchiveError(f"{path}: cut short in {stream_id}")
                    yield stream_id, (path, start, length)
                    offset = start + length
                    segment.seek(offset)


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (0, 0)
