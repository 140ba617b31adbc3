-- Gives back the ref of an affinity member's claim that failed
-- (group_bind.lua); the last ref unbinds the group from its host.
-- KEYS: group
-- ARGV: host the claim was let through for
-- Returns {'ok', refs}; nothing changes when the group is bound elsewhere
-- by now.
local cur = redis.call('HMGET', KEYS[1], 'host', 'refs')
local host, refs = cur[1] or '', tonumber(cur[2]) or 0
if host ~= ARGV[1] or refs == 0 then
  redis.call('HSET', KEYS[1], 'refs', refs)
  return {'ok', refs}
end
refs = refs - 1
if refs == 0 then
  redis.call('HSET', KEYS[1], 'host', '', 'refs', 0)
else
  redis.call('HSET', KEYS[1], 'refs', refs)
end
return {'ok', refs}
