-- Removes an instance's resize info, kept for a revert while a resize or
-- cold migration waits in VERIFY_RESIZE.
-- KEYS: instance
-- ARGV: updated_at
-- Returns {'ok'}, {'same'} (there was none) or {'unknown'}.
-- A record with nothing to clear has one field written again, unchanged:
-- a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'resize')
if not cur[1] then
  return {'unknown'}
end
if (cur[2] or '') == '' then
  redis.call('HSET', KEYS[1], 'uuid', cur[1])
  return {'same'}
end
redis.call('HDEL', KEYS[1], 'resize')
redis.call('HSET', KEYS[1], 'updated_at', ARGV[1])
return {'ok'}
