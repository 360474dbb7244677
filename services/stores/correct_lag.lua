-- Put the aggregator group's `entries-read` right (services/stores/backlog.py, `correct_lag`).
-- KEYS[1] the updates stream; fields: group. When the group's last-delivered-id is the stream's
-- last generated id, nothing was ever added after it: the group has read all `entries-added`
-- entries, whatever `entries-read` says. Then (only then) that counter is set to
-- `entries-added`, atomically with the check, the group's position set to where it is. Returns
-- the lag Redis reported before (0: nothing to correct; Redis 6.2 has no counter, no `lag`).
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end
local group_name = cjson.decode(ARGV[1]).group
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  if field(group, 'name') == group_name then
    local lag = field(group, 'lag')
    if not lag or lag == 0 then return 0 end
    local delivered = field(group, 'last-delivered-id')
    local stream = redis.call('XINFO', 'STREAM', KEYS[1])
    if field(stream, 'last-generated-id') ~= delivered then return 0 end
    redis.call('XGROUP', 'SETID', KEYS[1], group_name, delivered,
               'ENTRIESREAD', field(stream, 'entries-added'))
    return lag
  end
end
return 0
