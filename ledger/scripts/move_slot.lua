-- Takes, renews or gives back a slot for one move of guests between hosts
-- (a drain's migration), so that the moves running at once stay within a
-- limit for the whole cloud and one for each target. Slots are leases
-- timed by the server's clock: a slot whose holder stopped renewing it
-- (a drain terminated) ends by itself.
-- KEYS: the moves sorted set (member "target|move id", score: lease end)
-- ARGV: 'take', move id, target, cloud limit, target limit, lease ms
--    or 'renew', lease ms, member...
--    or 'give', member...
-- Returns for take {'ok'}, {'cloud', n} or {'target', n} (the limit that is
-- full and how many hold it); for renew the number renewed; for give the
-- number given back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local op = ARGV[1]
if op == 'give' then
  local n = 0
  for i = 2, #ARGV do
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
  return n
end
if op == 'renew' then
  local lease, n = tonumber(ARGV[2]), 0
  for i = 3, #ARGV do
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
      redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
      n = n + 1
    end
  end
  return n
end
local member = ARGV[3] .. '|' .. ARGV[2]
local lease = tonumber(ARGV[6])
if redis.call('ZSCORE', KEYS[1], member) then
  redis.call('ZADD', KEYS[1], now + lease, member)
  return {'ok'}
end
local all = redis.call('ZRANGE', KEYS[1], 0, -1)
if #all >= tonumber(ARGV[4]) then
  return {'cloud', #all}
end
local prefix, onTarget = ARGV[3] .. '|', 0
for _, m in ipairs(all) do
  if string.sub(m, 1, #prefix) == prefix then
    onTarget = onTarget + 1
  end
end
if onTarget >= tonumber(ARGV[5]) then
  return {'target', onTarget}
end
redis.call('ZADD', KEYS[1], now + lease, member)
return {'ok'}
