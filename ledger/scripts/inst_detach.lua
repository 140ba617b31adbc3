-- Clears an instance's host, node, placement and claim id, only while it
-- still names the given claim: a late retry must not detach the instance
-- from a claim made after it.
-- KEYS: instance
-- ARGV: claim id, updated_at
-- Returns {'ok'}, {'same'}, {'unknown'} or {'conflict', current claim id}.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'claim_id', 'host')
if not cur[1] then
  return {'unknown'}
end
if (cur[2] or '') == '' and (cur[3] or '') == '' then
  redis.call('HSET', KEYS[1], 'claim_id', '')
  return {'same'}
end
if cur[2] ~= ARGV[1] then
  return {'conflict', cur[2] or ''}
end
redis.call('HSET', KEYS[1], 'host', '', 'node', '', 'placement', '', 'claim_id', '', 'updated_at', ARGV[2])
return {'ok'}
