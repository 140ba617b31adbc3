-- Creates a server group unless it exists. Creating it again with the
-- same policy and limit is a retry and changes nothing (but writes the
-- policy again, so a wait for durability covers the first try).
-- KEYS: group
-- ARGV: policy, max members per host ('' for none), created at
-- Returns {'ok'} or {'conflict', policy, max per host}.
local cur = redis.call('HMGET', KEYS[1], 'policy', 'max_per_host')
if cur[1] then
  if cur[1] == ARGV[1] and (cur[2] or '') == ARGV[2] then
    redis.call('HSET', KEYS[1], 'policy', cur[1])
    return {'ok'}
  end
  return {'conflict', cur[1], cur[2] or ''}
end
redis.call('HSET', KEYS[1], 'policy', ARGV[1], 'max_per_host', ARGV[2], 'host', '', 'refs', 0, 'created_at', ARGV[3])
return {'ok'}
