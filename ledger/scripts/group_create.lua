-- Creates a server group unless it exists. Creating it again with the
-- same policy and limit is a retry and changes nothing (but writes the
-- policy again, so a wait for durability covers the first try).
-- KEYS: group
-- ARGV: policy, max members per host ('' for none), created at, max
--   members moving at once (0 for no budget)
-- Returns {'ok'} or {'conflict', policy, max per host, max moving}.
local cur = redis.call('HMGET', KEYS[1], 'policy', 'max_per_host', 'max_unavailable')
if cur[1] then
  if cur[1] == ARGV[1] and (cur[2] or '') == ARGV[2] and (cur[3] or '0') == ARGV[4] then
    redis.call('HSET', KEYS[1], 'policy', cur[1])
    return {'ok'}
  end
  return {'conflict', cur[1], cur[2] or '', cur[3] or '0'}
end
redis.call('HSET', KEYS[1], 'policy', ARGV[1], 'max_per_host', ARGV[2], 'host', '', 'refs', 0, 'created_at', ARGV[3],
  'max_unavailable', ARGV[4])
return {'ok'}
