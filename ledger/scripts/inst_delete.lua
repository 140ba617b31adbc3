-- Deletes an instance record that names no host and no claim.
-- KEYS: instance
-- Returns {'ok'}, {'gone'} or {'conflict', host, claim id}.
-- Deleting a deleted record writes it and deletes it again, in one step
-- nobody sees half done: a wait for durability after the script counts
-- only its own connection's writes, and so then covers the delete
-- another connection made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'host', 'claim_id')
if not cur[1] then
  redis.call('HSET', KEYS[1], 'uuid', '')
  redis.call('DEL', KEYS[1])
  return {'gone'}
end
if (cur[2] or '') ~= '' or (cur[3] or '') ~= '' then
  return {'conflict', cur[2] or '', cur[3] or ''}
end
redis.call('DEL', KEYS[1])
return {'ok'}
