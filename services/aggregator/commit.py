"""The commit: one Lua script that makes a batch of decisions durable, all or nothing.

It writes the new checkpoint, the model snapshot of the new version, the ledger entries, their
receipts and the dead letters, and acknowledges the stream entries they cover, in one atomic step.
Two guards run before anything is written:

- fencing: the caller's epoch must still be the newest; a second aggregator started later has
  raised it, so the older one's commits are refused and it stops;
- compare-and-set on the commit sequence number: a commit names the sequence it follows. If its
  reply was lost and it is sent again, the script sees its own sequence already in place and
  writes nothing: a retried commit is harmless.

Redis runs a script without interleaving other commands; since the guards come first and the
writes after them cannot fail on valid arguments, no partial commit is ever visible.

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

import redis.asyncio as aioredis

from fedasync.services.runtime.settings import DEFAULT_RECEIPTS_CAPACITY
from fedasync.services.stores.keys import AGGREGATOR_GROUP, Keys

log = logging.getLogger(__name__)

COMMIT_SCRIPT = """
local seq_key, epoch_key, state_key, version_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local models_key, ledger_key, updates_key, dead_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local done_key, receipts_key, order_key, memory_key = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local expected = tonumber(ARGV[1])
local epoch = ARGV[2]
if redis.call('GET', epoch_key) ~= epoch then
  return {-1, redis.call('GET', epoch_key) or ''}
end
local seq = tonumber(redis.call('GET', seq_key) or '0')
if seq == expected + 1 then return {0, seq} end
if seq ~= expected then return {-2, seq} end

local state, version, model = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local keep, group, channel, model_prefix = tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9]
local done_reason, now = ARGV[10], ARGV[11]
local n_ledger, n_dead, n_acks = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local capacity = tonumber(ARGV[15])
local n_remember, n_forget = tonumber(ARGV[16]), tonumber(ARGV[17])

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
local i = 18
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
if model ~= '' then redis.call('PUBLISH', channel, version) end
return {1, expected + 1}
"""


class Fenced(RuntimeError):
    """Another aggregator started after this one; this one must stop without writing."""


class CommitConflict(RuntimeError):
    """The commit sequence moved under us without a newer epoch: state in Redis was changed."""


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
    #: memory mode: (client id, delta bytes) to write to `{p}:memory`, and client ids to delete
    remember: list[tuple[str, bytes]] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)


class Committer:
    """Runs the commit script for one aggregator epoch.

    One attempt per call: the caller retries through the one retry policy
    (services/runtime/redis_conn.py: `retrying`), which is safe because of the CAS.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        epoch: int,
        seq: int,
        keep_versions: int,
        receipts: int = DEFAULT_RECEIPTS_CAPACITY,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._script = redis.register_script(COMMIT_SCRIPT)
        self.epoch = epoch
        self.seq = seq
        self._keep = keep_versions
        self._receipts = receipts

    async def commit(self, batch: Batch, now: float) -> None:
        """Make `batch` durable, or find it already in place (a retry whose first reply was
        lost); raises `Fenced` or `CommitConflict` without writing anything."""
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
            len(batch.remember),
            len(batch.forget),
        ]
        for client, delta in batch.remember:
            args += [client, delta]
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
            keys.memory,
        ]
        code, value = await self._script(keys=redis_keys, args=args)
        if code == -1:
            raise Fenced(f"aggregator epoch {self.epoch} was fenced off by epoch {value!r}")
        if code == -2:
            raise CommitConflict(f"commit sequence is {value}, expected {self.seq}")
        if code == 0:
            log.info("commit %d was already in place (a retried commit)", self.seq + 1)
        self.seq += 1
