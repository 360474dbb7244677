-- The commit (services/aggregator/commit.py says what and why). `Outcome` is prepended at load,
-- from `CommitOutcome`; the fields and where the values are: `Committer._run`, runtime/lua.py.
local seq_key, epoch_key, state_key, version_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local models_key, ledger_key, updates_key, dead_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local done_key, receipts_key, order_key = KEYS[9], KEYS[10], KEYS[11]
local announced_key, dedup_key, memory_key = KEYS[12], KEYS[13], KEYS[14]
local f = cjson.decode(ARGV[1])
local expected, group = f.expected, f.group
if redis.call('GET', epoch_key) ~= f.epoch then
  return {Outcome.FENCED, redis.call('GET', epoch_key) or ''}
end
local seq = tonumber(redis.call('GET', seq_key) or '0')
if seq == expected + 1 then
  -- already in place: write the same sequence again, so a WAIT after it covers the first write
  redis.call('SET', seq_key, seq)
  return {Outcome.IN_PLACE, seq}
end
if seq ~= expected then return {Outcome.SEQ_MOVED, seq} end
local acks = f.acks
for j = acks.id, acks.id + acks.n - 1 do
  if #redis.call('XPENDING', updates_key, group, ARGV[j], ARGV[j], 1) == 0 then
    return {Outcome.LOST_DELIVERY, ARGV[j]}
  end
end

local version, model = f.version, ARGV[f.at.model]
redis.call('SET', state_key, ARGV[f.at.state])
if model ~= '' then
  redis.call('SET', f.model_prefix .. version, model)
  redis.call('ZADD', models_key, version, version)
  local cutoff = version - f.keep
  if cutoff > 0 then
    for _, old in ipairs(redis.call('ZRANGEBYSCORE', models_key, '(0', cutoff)) do
      redis.call('DEL', f.model_prefix .. old)
    end
    redis.call('ZREMRANGEBYSCORE', models_key, '(0', cutoff)
  end
  redis.call('SET', version_key, version)
end
local dedup = f.dedup
local added = 0
while added < dedup.n do
  local chunk = {}
  for _ = 1, math.min(500, dedup.n - added) do
    chunk[#chunk + 1] = ARGV[dedup.key + added]
    chunk[#chunk + 1] = ARGV[dedup.id + added]
    added = added + 1
  end
  redis.call('ZADD', dedup_key, unpack(chunk))
end
redis.call('ZREMRANGEBYSCORE', dedup_key, '-inf', '(' .. f.dedup_floor)
local remember = f.remember
for k = 0, remember.n - 1 do
  redis.call('HSET', memory_key, ARGV[remember.client + k], ARGV[remember.delta + k])
end
local forget = f.forget
for k = 0, forget.n - 1 do
  redis.call('HDEL', memory_key, ARGV[forget.client + k])
end
local ledger = f.ledger
for k = 0, ledger.n - 1 do
  local receipt = ARGV[ledger.receipt + k]
  local ledger_id = redis.call('XADD', ledger_key, '*', 'd', ARGV[ledger.record + k])
  if redis.call('HSETNX', receipts_key, receipt, ledger_id) == 1 then
    redis.call('RPUSH', order_key, receipt)
  end
end
local excess = redis.call('LLEN', order_key) - f.capacity
while excess > 0 do
  local oldest = redis.call('LPOP', order_key, math.min(500, excess))
  redis.call('HDEL', receipts_key, unpack(oldest))
  excess = excess - #oldest
end
local dead = f.dead
for k = 0, dead.n - 1 do
  redis.call('XADD', dead_key, '*', 'reason', ARGV[dead.reason + k],
             'detail', ARGV[dead.detail + k], 'stream_id', ARGV[dead.stream_id + k],
             'payload', ARGV[dead.payload + k], 'at', f.now)
end
local acked = 0
while acked < acks.n do
  local last = math.min(acked + 500, acks.n)
  redis.call('XACK', updates_key, group, unpack(ARGV, acks.id + acked, acks.id + last - 1))
  acked = last
end
if f.done_reason ~= '' and redis.call('EXISTS', done_key) == 0 then
  redis.call('HSET', done_key, 'reason', f.done_reason, 'version', version, 'at', f.now)
end
redis.call('SET', seq_key, expected + 1)
if model ~= '' and f.announce then
  redis.call('SET', announced_key, version)
  redis.call('PUBLISH', f.channel, version)
end
return {Outcome.COMMITTED, expected + 1}
