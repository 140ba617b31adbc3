-- Takes an instance out of its server group (it is being deleted). The
-- last member to leave unbinds an affinity group from its host, so the
-- group's next member may go anywhere.
-- KEYS: group, members
-- ARGV: instance uuid
-- Returns {'ok'} (also when the group or the membership is gone already).
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[2], '')
  redis.call('DEL', KEYS[2])
  return {'ok'}
end
if redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[1], 'host', '', 'refs', 0)
else
  redis.call('HSET', KEYS[1], 'policy', redis.call('HGET', KEYS[1], 'policy'))
end
return {'ok'}
