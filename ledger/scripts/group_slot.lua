-- Takes, renews, keeps, drops or gives back a member's slot in its server
-- group's disruption budget: at most max_unavailable members may be
-- moving (an operation that stops or migrates them) at once. A slot is a
-- lease, timed by the server's clock, that its operation renews; a slot
-- whose lease ran out still counts until the caller, which can ask
-- Temporal, has judged that its operation ended (drop) or is still open
-- (keep): a move stays counted however long its workers are away.
-- KEYS: group, moving (sorted set: member uuid -> lease end, ms)
-- ARGV: 'take', uuid, lease ms, force ('1': counted even past the budget,
--   for an evacuation, whose guest is down already)
--    or 'renew', uuid, lease ms (the member's open operation: taken again
--   if it was dropped meanwhile, past the budget: its guest is moving)
--    or 'keep', uuid, lease ms (renews a slot still held)
--    or 'drop', uuid (only while its lease has run out)
--    or 'give', uuid
-- Returns for take {'ok', max}, {'none'} (the group has no budget),
-- {'unknown'}, {'full', max, uuid...} (the members holding the slots) or
-- {'expired', max, uuid...} (the budget is full, and these members'
-- leases ran out: judge them, then take again); for the others the
-- number of slots changed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, uuid = ARGV[1], ARGV[2]
if op == 'give' then
  return redis.call('ZREM', KEYS[2], uuid)
end
if op == 'drop' then
  local score = redis.call('ZSCORE', KEYS[2], uuid)
  if score and tonumber(score) <= now then
    return redis.call('ZREM', KEYS[2], uuid)
  end
  return 0
end
if op == 'keep' then
  return redis.call('ZADD', KEYS[2], 'XX', 'CH', now + tonumber(ARGV[3]), uuid)
end
if op == 'renew' then
  return redis.call('ZADD', KEYS[2], 'CH', now + tonumber(ARGV[3]), uuid)
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
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #expired > 0 then
  local reply = {'expired', tostring(max)}
  for _, m in ipairs(expired) do
    reply[#reply + 1] = m
  end
  return reply
end
local reply = {'full', tostring(max)}
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  reply[#reply + 1] = m
end
return reply
