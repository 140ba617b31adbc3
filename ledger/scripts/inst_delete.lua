-- Deletes an instance record that names no host and no claim.
-- KEYS: instance
-- Returns {'ok'}, {'gone'} or {'conflict', host, claim id}.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'host', 'claim_id')
if not cur[1] then
  return {'gone'}
end
if (cur[2] or '') ~= '' or (cur[3] or '') ~= '' then
  return {'conflict', cur[2] or '', cur[3] or ''}
end
redis.call('DEL', KEYS[1])
return {'ok'}
