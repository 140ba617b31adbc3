-- Deletes a server group that has no members.
-- KEYS: group, members, moving, hosts
-- Returns {'ok'}, {'gone'} or {'members', count}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[1], '')
  redis.call('DEL', KEYS[1])
  return {'gone'}
end
local n = redis.call('SCARD', KEYS[2])
if n > 0 then
  return {'members', n}
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return {'ok'}
