-- The idempotent XADD (services/ingest/store.py says what and why). `Outcome` is prepended at
-- load, from `IngestOutcome`. KEYS[1] the marker, KEYS[2] the updates stream, KEYS[3] the device
-- keys, KEYS[4] the run's done flag (a hash the aggregator's final commit sets); fields: digest (the body's), ttl_s (the marker's), signed_at_ms, window_ms, client and
-- key_sha1 (the fingerprint of the stored key the signature was checked with), and the entry's
-- name/value parts.
local f = cjson.decode(ARGV[1])
local existing = redis.call('GET', KEYS[1])
if existing then
  local sep = string.find(existing, ' ', 1, true)
  local id = string.sub(existing, 1, sep - 1)
  if string.sub(existing, sep + 1) == f.digest then
    redis.call('SET', KEYS[1], existing, 'KEEPTTL')
    return {Outcome.ALREADY_ADDED, id}
  end
  return {Outcome.UPDATE_ID_REUSED, id}
end
-- a retry of an update taken before the run ended is answered above; a new one is refused, since
-- no aggregator will decide it once the run's processes are stopped
local reason = redis.call('HGET', KEYS[4], 'reason')
if reason then
  return {Outcome.RUN_DONE, reason}
end
local stored = redis.call('HMGET', KEYS[3], f.client)[1]
if not stored or redis.sha1hex(stored) ~= f.key_sha1 then
  return {Outcome.KEY_CHANGED, ''}
end
local entry = f.entry
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, entry.part, entry.part + entry.n - 1))
local ms = tonumber(string.sub(id, 1, string.find(id, '-', 1, true) - 1))
if math.abs(ms - f.signed_at_ms) > f.window_ms then
  redis.call('XDEL', KEYS[2], id)
  return {Outcome.SIGNED_OUTSIDE_WINDOW, id}
end
redis.call('SET', KEYS[1], id .. ' ' .. f.digest, 'EX', f.ttl_s)
return {Outcome.ADDED, id}
