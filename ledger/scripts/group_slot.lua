-- Takes, renews or gives back a member's slot in its server group's
-- disruption budget: at most max_unavailable members may be moving (an
-- operation that stops or migrates them) at once. Slots are leases timed
-- by the server's clock, so the slot of an operation that was terminated
-- ends by itself.
-- KEYS: group, moving (sorted set: member uuid -> lease end, ms)
-- ARGV: 'take', uuid, lease ms, force ('1': counted even past the budget,
--   for an evacuation, whose guest is down already)
--    or 'renew', uuid, lease ms
--    or 'give', uuid
-- Returns for take {'ok', max}, {'none'} (the group has no budget), {'unknown'}
-- or {'full', max, uuid...} (the members holding the slots); for renew and
-- give the number renewed or given back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local op, uuid = ARGV[1], ARGV[2]
if op == 'give' then
  return redis.call('ZREM', KEYS[2], uuid)
end
if op == 'renew' then
  return redis.call('ZADD', KEYS[2], 'XX', 'CH', now + tonumber(ARGV[3]), uuid)
end
local cur = redis.call('HMGET', KEYS[1], 'policy', 'max_unavailable')
if not cur[1] then
  return {'unknown'}
end
local max = tonumber(cur[2]) or 0
if max == 0 then
  return {'none'}
end
local lease = tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[2], uuid) or ARGV[4] == '1' or redis.call('ZCARD', KEYS[2]) < max then
  redis.call('ZADD', KEYS[2], now + lease, uuid)
  return {'ok', tostring(max)}
end
local reply = {'full', tostring(max)}
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  reply[#reply + 1] = m
end
return reply
