-- Turns a down host's automatic evacuation on or off: while on, every
-- audit of the host starts an evacuation of each guest still there. Only
-- a down host has it; leaving down drops it (host_state.lua).
-- KEYS: topo, host state
-- ARGV: 'on' or 'off'
-- Returns {'ok', state, reason, token, since, evacuate}, {'nohost'} or
-- {'conflict', current state}.
if not redis.call('HGET', KEYS[1], 'gen') then
  return {'nohost'}
end
local cur = redis.call('HMGET', KEYS[2], 'state', 'reason', 'token', 'since')
if cur[1] ~= 'down' then
  return {'conflict', cur[1] or 'up'}
end
-- Written even when unchanged: a wait for durability counts only this
-- connection's writes.
local on = ''
if ARGV[1] == 'on' then
  on = 'on'
  redis.call('HSET', KEYS[2], 'evacuate', 'on')
else
  redis.call('HSET', KEYS[2], 'state', 'down')
  redis.call('HDEL', KEYS[2], 'evacuate')
end
return {'ok', 'down', cur[2] or '', cur[3] or '', cur[4] or '', on}
