"""The commit: one Lua script that makes a batch of decisions durable, all or nothing.

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
`announce` runs the small ANNOUNCE_SCRIPT. So no device is ever offered a version that a failover
could take back (docs/architecture.md, "Past one machine"). A retried commit that finds itself in
place writes its sequence number again, the same value, so that the WAIT after it covers the first
attempt's writes.

Per-client memory (the `memory` mode, shared/aggregation.py): the checkpoint leaves the clients'
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
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import replicated
from fedasync.services.runtime.settings import DEFAULT_RECEIPTS_CAPACITY, Durability
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.continuity import Check

log = logging.getLogger(__name__)

COMMIT_SCRIPT = """
local seq_key, epoch_key, state_key, version_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local models_key, ledger_key, updates_key, dead_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local done_key, receipts_key, order_key = KEYS[9], KEYS[10], KEYS[11]
local announced_key, dedup_key, memory_key = KEYS[12], KEYS[13], KEYS[14]
local expected = tonumber(ARGV[1])
local epoch = ARGV[2]
if redis.call('GET', epoch_key) ~= epoch then
  return {-1, redis.call('GET', epoch_key) or ''}
end
local seq = tonumber(redis.call('GET', seq_key) or '0')
if seq == expected + 1 then
  -- already in place: write the same sequence again, so a WAIT after it covers the first write
  redis.call('SET', seq_key, seq)
  return {0, seq}
end
if seq ~= expected then return {-2, seq} end

local state, version, model = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local keep, group, channel, model_prefix = tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9]
local done_reason, now = ARGV[10], ARGV[11]
local n_ledger, n_dead, n_acks = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local capacity = tonumber(ARGV[15])
local announce = ARGV[16] == '1'
local n_dedup, dedup_floor = tonumber(ARGV[17]), ARGV[18]
local n_remember, n_forget = tonumber(ARGV[19]), tonumber(ARGV[20])
local first_ack = 21 + 2 * n_dedup + 2 * n_remember + n_forget + 2 * n_ledger + 4 * n_dead
for j = first_ack, first_ack + n_acks - 1 do
  if #redis.call('XPENDING', updates_key, group, ARGV[j], ARGV[j], 1) == 0 then
    return {-3, ARGV[j]}
  end
end

redis.call('SET', state_key, state)
if model ~= '' then
  redis.call('SET', model_prefix .. version, model)
  redis.call('ZADD', models_key, version, version)
  local cutoff = version - keep
  if cutoff > 0 then
    for _, old in ipairs(redis.call('ZRANGEBYSCORE', models_key, '(0', cutoff)) do
      redis.call('DEL', model_prefix .. old)
    end
    redis.call('ZREMRANGEBYSCORE', models_key, '(0', cutoff)
  end
  redis.call('SET', version_key, version)
end
local i = 21
local added = 0
while added < n_dedup do
  local chunk = {}
  for _ = 1, math.min(500, n_dedup - added) do
    chunk[#chunk + 1] = ARGV[i + 1]
    chunk[#chunk + 1] = ARGV[i]
    i = i + 2
    added = added + 1
  end
  redis.call('ZADD', dedup_key, unpack(chunk))
end
redis.call('ZREMRANGEBYSCORE', dedup_key, '-inf', '(' .. dedup_floor)
for _ = 1, n_remember do
  redis.call('HSET', memory_key, ARGV[i], ARGV[i + 1])
  i = i + 2
end
for _ = 1, n_forget do
  redis.call('HDEL', memory_key, ARGV[i])
  i = i + 1
end
for _ = 1, n_ledger do
  local ledger_id = redis.call('XADD', ledger_key, '*', 'd', ARGV[i])
  if redis.call('HSETNX', receipts_key, ARGV[i + 1], ledger_id) == 1 then
    redis.call('RPUSH', order_key, ARGV[i + 1])
  end
  i = i + 2
end
local excess = redis.call('LLEN', order_key) - capacity
while excess > 0 do
  local oldest = redis.call('LPOP', order_key, math.min(500, excess))
  redis.call('HDEL', receipts_key, unpack(oldest))
  excess = excess - #oldest
end
for _ = 1, n_dead do
  redis.call('XADD', dead_key, '*', 'reason', ARGV[i], 'detail', ARGV[i + 1],
             'stream_id', ARGV[i + 2], 'payload', ARGV[i + 3], 'at', now)
  i = i + 4
end
local acked = 0
while acked < n_acks do
  local chunk = {}
  for _ = 1, math.min(500, n_acks - acked) do
    chunk[#chunk + 1] = ARGV[i]
    i = i + 1
    acked = acked + 1
  end
  redis.call('XACK', updates_key, group, unpack(chunk))
end
if done_reason ~= '' and redis.call('EXISTS', done_key) == 0 then
  redis.call('HSET', done_key, 'reason', done_reason, 'version', version, 'at', now)
end
redis.call('SET', seq_key, expected + 1)
if model ~= '' and announce then
  redis.call('SET', announced_key, version)
  redis.call('PUBLISH', channel, version)
end
return {1, expected + 1}
"""

#: durable mode's announcement, once the commit is on the replicas: the announced version only
#: grows (an older aggregator's late announcement never takes it back)
ANNOUNCE_SCRIPT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local version = tonumber(ARGV[1])
if version > current then redis.call('SET', KEYS[1], version) end
redis.call('PUBLISH', ARGV[2], math.max(version, current))
return current
"""


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
        self._script = redis.register_script(COMMIT_SCRIPT)
        self._announce = redis.register_script(ANNOUNCE_SCRIPT)
        self.epoch = epoch
        self.seq = seq
        self._keep = keep_versions
        self._receipts = receipts
        self._durability = durability or Durability()

    @property
    def durable(self) -> bool:
        """Commits wait for the replicas, and are announced after (`announce`)."""
        return self._durability.replicas > 0

    async def commit(self, batch: Batch, now: float) -> None:
        """Make `batch` durable, or find it already in place (a retry whose first reply was
        lost); raises `Fenced` or `CommitConflict` without writing anything. In durable mode it
        returns once the replicas hold the commit (else `NotReplicated`, transient: the retry
        finds it in place and waits again), and the caller announces the version (`announce`).
        """
        code = await replicated(
            self._redis, self._durability, lambda client: self._run(batch, now, client)
        )
        if code == 0:
            log.info("commit %d was already in place (a retried commit)", self.seq + 1)
        self.seq += 1

    async def announce(self, version: int) -> None:
        """Durable mode: offer `version` to the snapshot services (its commit is on the
        replicas). Idempotent: the announced version never goes down."""
        await self._announce(
            keys=[self._keys.announced], args=[version, self._keys.versions_channel]
        )

    async def _run(self, batch: Batch, now: float, client: aioredis.Redis) -> int:
        keys = self._keys
        args: list[bytes | str | int | float] = [
            self.seq,
            self.epoch,
            batch.state,
            batch.version,
            batch.model,
            self._keep,
            AGGREGATOR_GROUP,
            keys.versions_channel,
            keys.model(0)[:-1],
            batch.done_reason,
            repr(now),
            len(batch.ledger),
            len(batch.dead),
            len(batch.acks),
            self._receipts,
            "0" if self.durable else "1",
            len(batch.dedup),
            batch.dedup_floor,
            len(batch.remember),
            len(batch.forget),
        ]
        for update_id, key in batch.dedup:
            args += [update_id, key]
        for device, delta in batch.remember:
            args += [device, delta]
        args += batch.forget
        for entry in batch.ledger:
            args += [entry.record, entry.receipt]
        for dead in batch.dead:
            args += [dead.reason, dead.detail, dead.stream_id, dead.payload]
        args += batch.acks
        redis_keys = [
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
        reply: Any = await self._script(keys=redis_keys, args=args, client=client)
        code, value = reply
        if code == -1:
            raise Fenced(f"aggregator epoch {self.epoch} was fenced off by epoch {value!r}")
        if code == -2:
            raise CommitConflict(
                Check.COMMIT_SEQ_MOVED, f"commit sequence is {value}, expected {self.seq}"
            )
        if code == -3:
            lost = value.decode() if isinstance(value, bytes) else str(value)
            raise CommitConflict(
                Check.GROUP_LOST_DELIVERY,
                f"entry {lost} is not pending in the group: its delivery was lost",
            )
        return int(code)
