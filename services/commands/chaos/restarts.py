"""What a Redis kill -9 must not take away: read just before the kill, again just after the restart.

Redis runs with an append-only file fsynced at every write, so every write it acknowledged before
the kill must be there after the restart: the commit sequence, the state and its model, the
ledger, the consumer group, the updates stream. The harness pauses every write (`CLIENT PAUSE
WRITE`) for each reading, so a reading is one instant; the one before the kill is exactly what
the killed server held, since nothing can be written between it and the kill. The services can
write between the restart and the second reading (the aggregator reconnects within
milliseconds), so the comparison accepts what a commit can change (more of everything) and
nothing a loss would show (less of anything, or something written before the kill now
different). The second reading also runs the aggregator's own start-up check
(shared/continuity.py) on what it finds: the state must match its ledger and group.

`compare` is pure; `read_marks` is the only part that talks to Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from fedasync.services.aggregator.inspection import inspect
from fedasync.services.runtime.redis_conn import as_text, connect, get_bytes
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.ledger import export_line, last_record, record_at
from fedasync.shared.continuity import Found, entry_id, mismatches
from fedasync.shared.keys import Keys

#: longest a reading holds every write, ms (it takes a few; the pause is lifted as soon as done)
PAUSE_MS = 5_000


@dataclass(frozen=True, slots=True)
class Marks:
    """What Redis held at one instant, reduced to what a restart must keep."""

    found: Found
    #: sha256 of the state checkpoint and of the model of `found.version` ("" when absent)
    state_sha: str
    model_sha: str
    #: id and sha256 of the newest ledger entry
    ledger_last_id: str | None
    ledger_last_sha: str
    updates_length: int
    updates_last_id: str | None
    #: in the reading after a restart: the sha256 of what the reading before named (the model
    #: of its version, its newest ledger entry) as found now; "" when absent
    earlier_model_sha: str = ""
    earlier_ledger_sha: str = ""


@dataclass(slots=True)
class RestartCheck:
    """One Redis kill -9 and restart: the two readings, and what did not survive."""

    at: float
    before: Marks | None = None
    after: Marks | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.before is not None and self.after is not None and not self.problems

    def to_dict(self) -> dict[str, Any]:
        def pair(value: Any) -> list[Any]:
            return [value(m) if m is not None else None for m in (self.before, self.after)]

        return {
            "at": round(self.at, 3),
            "intact": self.intact,
            "commit_seq": pair(lambda m: m.found.commit_seq),
            "version": pair(lambda m: m.found.version),
            "ledger": pair(lambda m: m.found.ledger_length),
            "delivered": pair(lambda m: m.found.group and m.found.group.last_delivered),
            "updates": pair(lambda m: m.updates_length),
            "problems": self.problems,
        }


def compare(before: Marks, after: Marks, keep_versions: int) -> list[str]:
    """What `after` lost of `before` (empty: intact). `keep_versions` is the aggregator's: a
    commit after the restart may have dropped the model of `before`'s version, if the version
    moved on by at least that many."""
    b, a = before.found, after.found
    problems = [f"after the restart, {m}" for m in mismatches(a)]
    if a.commit_seq < b.commit_seq:
        problems.append(f"commit sequence went back from {b.commit_seq} to {a.commit_seq}")
    if a.commit_seq == b.commit_seq:  # no commit since: everything as it was
        for name, was, now in (
            ("state", before.state_sha, after.state_sha),
            ("version", b.version, a.version),
            ("model", before.model_sha, after.model_sha),
            ("ledger length", b.ledger_length, a.ledger_length),
            ("newest ledger entry", before.ledger_last_id, after.ledger_last_id),
        ):
            if was != now:
                problems.append(f"{name} changed without a commit: {was} → {now}")
    if (a.version or 0) < (b.version or 0):
        problems.append(f"version went back from {b.version} to {a.version}")
    if a.ledger_length < b.ledger_length:
        problems.append(f"ledger shrank from {b.ledger_length} to {a.ledger_length}")
    if before.ledger_last_id is not None and after.earlier_ledger_sha != before.ledger_last_sha:
        problems.append(f"ledger entry {before.ledger_last_id} lost or changed")
    # absent is fine only if commits since moved the version on far enough to drop it
    trimmed = not after.earlier_model_sha and (a.version or 0) - (b.version or 0) >= keep_versions
    if before.model_sha and after.earlier_model_sha != before.model_sha and not trimmed:
        problems.append(f"model {b.version} lost or changed")
    if b.group is not None and (
        a.group is None or entry_id(a.group.last_delivered) < entry_id(b.group.last_delivered)
    ):
        problems.append("consumer group lost or moved back")
    if after.updates_length < before.updates_length or _newer(
        before.updates_last_id, after.updates_last_id
    ):
        problems.append("updates stream lost entries")
    if b.started and not a.started:
        problems.append("start time lost")
    return problems


def _newer(first: str | None, second: str | None) -> bool:
    """`first` names a later entry than `second` (None: no entry)."""
    if first is None:
        return False
    return second is None or entry_id(first) > entry_id(second)


def read_marks(
    url: str,
    keys: Keys,
    earlier: Marks | None = None,
    *,
    unpause: bool = True,
    socket_timeout_s: float = 10.0,
) -> Marks:
    """One reading with every write paused; `earlier` names what to look up again (the model and
    ledger entry a reading before the kill saw). Without `unpause` writes stay paused (for at
    most PAUSE_MS): a kill right after it then takes exactly what was read. Needs a user that
    may CLIENT PAUSE and read every key (the harness's observer)."""
    admin = redis.Redis.from_url(url, socket_timeout=socket_timeout_s)
    try:
        admin.client_pause(PAUSE_MS, all=False)
        try:
            return asyncio.run(_read(url, keys, earlier, socket_timeout_s))
        finally:
            if unpause:
                admin.client_unpause()
    finally:
        admin.close()


async def _read(url: str, keys: Keys, earlier: Marks | None, timeout: float) -> Marks:
    client = connect(RedisSettings(url=url, socket_timeout_s=timeout))
    try:
        inspection = await inspect(client, keys)
        found = inspection.found
        last = await last_record(client, keys)
        newest: Any = await client.xrevrange(keys.updates, count=1)
        marks = Marks(
            found=found,
            state_sha=_sha(inspection.raw_state),
            model_sha=_sha(inspection.raw_model),
            ledger_last_id=None if last is None else str(last["ledger_id"]),
            ledger_last_sha=_record_sha(last),
            updates_length=int(await client.xlen(keys.updates)),
            updates_last_id=as_text(newest[0][0]) if newest else None,
        )
        if earlier is None:
            return marks
        model = None
        if earlier.found.version is not None:
            model = await get_bytes(client, keys.model(earlier.found.version))
        entry = None
        if earlier.ledger_last_id is not None:
            entry = await record_at(client, keys, earlier.ledger_last_id)
        return replace(marks, earlier_model_sha=_sha(model), earlier_ledger_sha=_record_sha(entry))
    finally:
        await client.aclose()


def _sha(raw: bytes | None) -> str:
    return hashlib.sha256(raw).hexdigest() if raw else ""


def _record_sha(record: dict[str, Any] | None) -> str:
    """sha256 of a ledger record as `fedasync ledger export` writes it ("" for none)."""
    return _sha(export_line(record).encode()) if record is not None else ""
