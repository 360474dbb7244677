-- Durable mode's announcement, once the commit is on the replicas (services/aggregator/commit.py,
-- `Committer.announce`): the announced version only grows, so an older aggregator's late
-- announcement never takes it back. KEYS[1] the announced version; fields: version, channel.
local f = cjson.decode(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local version = f.version
if version > current then redis.call('SET', KEYS[1], version) end
redis.call('PUBLISH', f.channel, math.max(version, current))
return current
