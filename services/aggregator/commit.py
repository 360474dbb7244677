"""The commit: one Lua script that makes a batch of decisions durable, all or nothing.

The script is commit.lua, beside this file. It takes its arguments by name (one JSON object of
fields, the batch's bytes as ARGV entries it names: services/runtime/lua.py) and ends in one of
the outcomes `CommitOutcome` names; the Lua reads the same names, made from that enum at load.

It writes the new checkpoint, the model snapshot of the new version, the ledger entries, their
receipts and the dead letters, and acknowledges the stream entries they cover, in one atomic step.
Two guards run before anything is written:

- fencing: the caller's epoch must still be the newest; a second aggregator started later has
  raised it, so the older one's commits are refused and it stops;
- compare-and-set on the commit sequence number: a commit names the sequence it follows. If its
  reply was lost and it is sent again, the script sees its own sequence already in place and
  writes nothing: a retried commit is harmless;
- every entry it acknowledges is pending in the group. One that is not was never delivered on
  this server: Redis lost the read that delivered it (a failover to a replica that had the entry
  but not the read), and acknowledging it would leave it to be delivered, and decided, again. The
  commit is refused like a moved sequence (`CommitConflict`, check `group-lost-delivery`).

Redis runs a script without interleaving other commands; since the guards come first and the
writes after them cannot fail on valid arguments, no partial commit is ever visible.

Announcing: a commit that makes a new version sets `{p}:announced` to it and publishes it on the
versions channel, which is how the snapshot service learns of it. In durable mode
(`FEDASYNC_REDIS__DURABLE_REPLICAS` = N) the commit announces nothing: `Committer.commit` returns
only once WAIT says N replicas hold it (services/runtime/redis_conn.py, `replicated`), and then
`announce` runs the small announce.lua. So no device is ever offered a version that a failover
could take back (docs/architecture.md, "Past one machine"). A retried commit that finds itself in
place writes its sequence number again, the same value, so that the WAIT after it covers the first
attempt's writes.

Per-client memory (the `memory` mode, shared/modes/memory.py): the checkpoint leaves the clients'
remembered deltas out; each commit writes to `{p}:memory` only the clients whose delta changed
in its batch (HSET) or that were forgotten (HDEL), in the same script as the state that names
them, so the hash and the state always belong to the same commit.

Receipts: each ledger entry names its update (`update_digest(client id, update id)`); the first
decision about an update is indexed in `{p}:receipts` (field → ledger entry id, HSETNX: a later
duplicate never hides it) and its field appended to `{p}:receipts-order`. Beyond `capacity`
receipts the oldest are popped from the list and deleted from the hash, so the index holds at
most `capacity` fields. Written in the same script as the ledger entry, a receipt exists exactly
when its decision is durable, and a retried commit writes neither twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime import lua
from fedasync.services.runtime.redis_conn import as_text, replicated
from fedasync.services.runtime.settings import DEFAULT_RECEIPTS_CAPACITY, Durability
from fedasync.shared.continuity import Check
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys

log = logging.getLogger(__name__)


class CommitOutcome(StrEnum):
    """How the commit script ended: the value it returns, from the prelude made of this enum
    (services/runtime/lua.py), so both sides read these names and nothing else."""

    #: the batch is written; the commit sequence is one more
    COMMITTED = "committed"
    #: the sequence is already one more: a retry whose first reply was lost; nothing written again
    IN_PLACE = "in-place"
    #: the epoch is not the caller's: a later aggregator fenced this one off (`Fenced`)
    FENCED = "fenced"
    #: the sequence is neither the expected one nor one more (`CommitConflict`, commit-seq-moved)
    SEQ_MOVED = "seq-moved"
    #: an entry to acknowledge is not pending (`CommitConflict`, group-lost-delivery)
    LOST_DELIVERY = "lost-delivery"


#: the commit itself (commit.lua, beside this file), and durable mode's announcement, once the
#: commit is on the replicas (announce.lua): the announced version only grows
COMMIT_SCRIPT = lua.load(__package__, "commit.lua", CommitOutcome)
ANNOUNCE_SCRIPT = lua.load(__package__, "announce.lua")


class Fenced(RuntimeError):
    """Another aggregator started after this one; this one must stop without writing."""


class CommitConflict(RuntimeError):
    """The commit sequence moved under us without a newer epoch, or an entry to acknowledge is
    not pending: state in Redis was changed (`check` names which, shared/continuity.py)."""

    def __init__(self, check: Check, message: str) -> None:
        super().__init__(message)
        self.check = check


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    stream_id: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One decision record (msgpack) and the receipts field of the update it decides."""

    record: bytes
    receipt: str


@dataclass(slots=True)
class Batch:
    """What one commit makes durable."""

    state: bytes
    version: int
    model: bytes  # empty when the version did not change
    ledger: list[LedgerEntry] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)
    done_reason: str = ""
    #: update ids the dedup memory took in since the last commit, (id, key), and its floor
    dedup: list[tuple[str, int]] = field(default_factory=list)
    dedup_floor: int = 0
    #: (stream id, payload) of the ledger's updates, for the archive (when there is one)
    archive: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: memory mode: (client id, delta bytes) to write to `{p}:memory`, and client ids to delete
    remember: list[tuple[str, bytes]] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)


class Committer:
    """Runs the commit script for one aggregator epoch.

    One attempt per call: the caller retries through the one retry policy
    (services/runtime/redis_conn.py: `retrying`), which is safe because of the CAS.
    `durability`: durable mode (`RedisSettings.durability`); None: off.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        epoch: int,
        seq: int,
        keep_versions: int,
        receipts: int = DEFAULT_RECEIPTS_CAPACITY,
        durability: Durability | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.epoch = epoch
        self.seq = seq
        self._keep = keep_versions
        self._receipts = receipts
        self._durability = durability or Durability()

    @property
    def durable(self) -> bool:
        """Commits wait for the replicas, and are announced after (`announce`)."""
        return self._durability.replicas > 0

    async def commit(self, batch: Batch, now: float) -> CommitOutcome:
        """Make `batch` durable (COMMITTED), or find it already in place (IN_PLACE: a retry
        whose first reply was lost); raises `Fenced` or `CommitConflict` without writing
        anything. In durable mode it returns once the replicas hold the commit (else
        `NotReplicated`, transient: the retry finds it in place and waits again), and the caller
        announces the version (`announce`).
        """
        outcome = await replicated(
            self._redis,
            self._durability,
            lambda client: self._run(batch, now, client),
            key=self._keys.state,
        )
        if outcome is CommitOutcome.IN_PLACE:
            log.info("commit %d was already in place (a retried commit)", self.seq + 1)
        self.seq += 1
        return outcome

    async def announce(self, version: int) -> None:
        """Durable mode: offer `version` to the snapshot services (its commit is on the
        replicas). Idempotent: the announced version never goes down."""
        args = lua.ScriptArgs(version=version, channel=self._keys.versions_channel)
        await ANNOUNCE_SCRIPT(self._redis, keys=[self._keys.announced], args=args.argv())

    async def _run(self, batch: Batch, now: float, client: aioredis.Redis) -> CommitOutcome:
        keys = self._keys
        args = lua.ScriptArgs(
            expected=self.seq,
            epoch=str(self.epoch),
            version=batch.version,
            keep=self._keep,
            group=AGGREGATOR_GROUP,
            channel=keys.versions_channel,
            model_prefix=keys.model(0)[:-1],
            done_reason=batch.done_reason,
            now=repr(now),
            capacity=self._receipts,
            announce=not self.durable,
            dedup_floor=str(batch.dedup_floor),
        )
        args.value("state", batch.state)
        args.value("model", batch.model)
        args.section(
            "dedup",
            id=[update_id for update_id, _ in batch.dedup],
            key=[key for _, key in batch.dedup],
        )
        args.section(
            "remember",
            client=[device for device, _ in batch.remember],
            delta=[delta for _, delta in batch.remember],
        )
        args.section("forget", client=batch.forget)
        args.section(
            "ledger",
            record=[entry.record for entry in batch.ledger],
            receipt=[entry.receipt for entry in batch.ledger],
        )
        args.section(
            "dead",
            reason=[dead.reason for dead in batch.dead],
            detail=[dead.detail for dead in batch.dead],
            stream_id=[dead.stream_id for dead in batch.dead],
            payload=[dead.payload for dead in batch.dead],
        )
        args.section("acks", id=batch.acks)
        redis_keys = [  # as commit.lua names them at its top
            keys.commit_seq,
            keys.epoch,
            keys.state,
            keys.version,
            keys.models,
            keys.ledger,
            keys.updates,
            keys.deadletter,
            keys.done,
            keys.receipts,
            keys.receipts_order,
            keys.announced,
            keys.dedup,
            keys.memory,
        ]
        reply: Any = await COMMIT_SCRIPT(client, keys=redis_keys, args=args.argv())
        outcome, value = lua.outcome(CommitOutcome, reply[0]), reply[1]
        if outcome is CommitOutcome.FENCED:
            raise Fenced(f"aggregator epoch {self.epoch} was fenced off by epoch {value!r}")
        if outcome is CommitOutcome.SEQ_MOVED:
            raise CommitConflict(
                Check.COMMIT_SEQ_MOVED, f"commit sequence is {value}, expected {self.seq}"
            )
        if outcome is CommitOutcome.LOST_DELIVERY:
            raise CommitConflict(
                Check.GROUP_LOST_DELIVERY,
                f"entry {as_text(value)} is not pending in the group: its delivery was lost",
            )
        return outcome
