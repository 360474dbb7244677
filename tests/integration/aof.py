"""Redis append-only files, edited the way a faulty replay reads them (test helper).

Redis 7.0 (and 7.2 before redis/redis#14545) replays the AOF as the default user and re-checks
that user's ACL at each EXEC: with a restricted default user it skipped every MULTI/EXEC block,
and kept every command logged on its own. `drop_transactions` makes that loss on purpose, on any
Redis version, so a test can restart a server on exactly what such a replay leaves.
"""

from __future__ import annotations

from pathlib import Path


def commands(aof: bytes) -> list[bytes]:
    """The AOF cut into its commands, each as its RESP bytes (`*<n>` then n bulk strings)."""
    out, at = [], 0
    while at < len(aof):
        start = at
        if aof[at : at + 1] != b"*":
            raise ValueError(f"not a RESP array at byte {at}")
        end = aof.index(b"\r\n", at)
        count, at = int(aof[at + 1 : end]), end + 2
        for _ in range(count):
            end = aof.index(b"\r\n", at)
            length = int(aof[at + 1 : end])
            at = end + 2 + length + 2
        out.append(aof[start:at])
    return out


def name_of(command: bytes) -> bytes:
    """The command's name, upper case (the first bulk string)."""
    first = command.index(b"\r\n") + 2
    end = command.index(b"\r\n", first)
    length = int(command[first + 1 : end])
    return command[end + 2 : end + 2 + length].upper()


def drop_transactions(aof: bytes) -> tuple[bytes, int]:
    """`aof` without its MULTI ... EXEC blocks, and how many blocks were dropped."""
    kept, dropped, inside = [], 0, False
    for command in commands(aof):
        name = name_of(command)
        if name == b"MULTI":
            inside = True
        elif name == b"EXEC":
            inside, dropped = False, dropped + 1
        elif not inside:
            kept.append(command)
    return b"".join(kept), dropped


def incremental_files(directory: Path) -> list[Path]:
    """The incremental AOF files of a Redis 7 data directory (where every command since start is
    logged; the base file is the empty snapshot taken at the first start)."""
    found = sorted(directory.glob("appendonlydir/*.incr.aof"))
    if not found:
        raise FileNotFoundError(f"no incremental AOF under {directory}")
    return found
