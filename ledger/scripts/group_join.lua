-- Makes an instance a member of a server group, for life. The caller
-- recorded the group's policy and limit in the instance's record first:
-- a group deleted and made again with another rule meanwhile is refused,
-- so a member's record always states its group's rule.
-- KEYS: group, members
-- ARGV: instance uuid, policy, max members per host ('' for none)
-- Returns {'ok'}, {'unknown'} or {'changed', policy, max per host}.
local cur = redis.call('HMGET', KEYS[1], 'policy', 'max_per_host')
if not cur[1] then
  return {'unknown'}
end
if cur[1] ~= ARGV[2] or (cur[2] or '') ~= ARGV[3] then
  return {'changed', cur[1], cur[2] or ''}
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'policy', cur[1])
return {'ok'}
