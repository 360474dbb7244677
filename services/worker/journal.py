"""The publish journal: what a worker attempted to publish and what Redis acknowledged.

Optional (setting `FEDASYNC_WORKER__JOURNAL`): the chaos harness needs to know which publishes
were *acknowledged* (XADD returned an entry id to the worker) to check that each one got exactly
one decision, and which were merely *attempted* (a decision for those is legitimate, not a
phantom). Each line is written with one `os.write` on a file opened with `O_APPEND`, straight to
the kernel: a kill -9 of the worker right after cannot lose a line it already wrote, and lines of
several processes sharing a file never interleave.

Format, one event per line, tab-separated: `attempt <update_id>` just before the XADD, and
`ack <update_id> <entry_id>` right after it returned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ATTEMPT = "attempt"
ACK = "ack"


class Journal:
    """Appends journal lines to `path`; every method is a no-op when `path` is None."""

    def __init__(self, path: str | None) -> None:
        self._path = path

    def attempted(self, update_id: str) -> None:
        self._append(f"{ATTEMPT}\t{update_id}\n")

    def acknowledged(self, update_id: str, entry_id: str) -> None:
        self._append(f"{ACK}\t{update_id}\t{entry_id}\n")

    def _append(self, line: str) -> None:
        if self._path is None:
            return
        # opened per line: no descriptor to leak, nothing buffered in this process
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@dataclass(slots=True)
class JournalContents:
    """What journals say: ids attempted, and the entry id of each acknowledged publish."""

    attempted: set[str] = field(default_factory=set)
    acknowledged: dict[str, str] = field(default_factory=dict)
    #: lines that could not be parsed (a torn last line would land here; it never should)
    malformed: int = 0


def read_journals(paths: list[Path]) -> JournalContents:
    """Merge journal files; an id acknowledged is also counted as attempted."""
    out = JournalContents()
    for path in paths:
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if parts[0] == ATTEMPT and len(parts) == 2:
                out.attempted.add(parts[1])
            elif parts[0] == ACK and len(parts) == 3:
                out.attempted.add(parts[1])
                out.acknowledged[parts[1]] = parts[2]
            else:
                out.malformed += 1
    return out
