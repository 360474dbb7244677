-- A policy change, a compare-and-set on the version (services/stores/policy_store.py,
-- `change_policy`). `Outcome` is prepended at load, from `PolicyChange`.
-- KEYS: policy, policies, policy log[, switches]. Fields: in_force (the version read), version
-- (the new one's history field); values: policy (the new one), entry (its log record); with a
-- switch also the field switch (its name) and the values before (its record as read, '' if
-- none) and after (its new record, '' to delete it).
-- With the switches hash the flip is one step: a policy changed by a switch always has the
-- record that restores it, and a crash can never leave one without the other.
local f = cjson.decode(ARGV[1])
local current = redis.call('GET', KEYS[1])
if current and cjson.decode(current)['version'] ~= f.in_force then
  return Outcome.VERSION_MOVED
end
local switched = f.switch ~= nil
if switched and (redis.call('HGET', KEYS[4], f.switch) or '') ~= ARGV[f.at.before] then
  return Outcome.SWITCH_MOVED
end
if redis.call('HSETNX', KEYS[2], f.version, ARGV[f.at.policy]) == 0 then
  return Outcome.VERSION_RECORDED
end
redis.call('SET', KEYS[1], ARGV[f.at.policy])
redis.call('RPUSH', KEYS[3], ARGV[f.at.entry])
if switched then
  if ARGV[f.at.after] == '' then
    redis.call('HDEL', KEYS[4], f.switch)
  else
    redis.call('HSET', KEYS[4], f.switch, ARGV[f.at.after])
  end
end
return Outcome.CHANGED
