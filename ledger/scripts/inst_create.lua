-- Creates an instance record unless it exists. Creating it again with the
-- same name and request is a retry and succeeds without changing it.
-- KEYS: instance
-- ARGV: uuid, name, request JSON, vm_state, task_state, updated_at
-- Returns {'ok'}, {'exists'} or {'conflict', name, request}.
local cur = redis.call('HMGET', KEYS[1], 'name', 'request')
if cur[1] then
  if cur[1] == ARGV[2] and cur[2] == ARGV[3] then
    return {'exists'}
  end
  return {'conflict', cur[1], cur[2]}
end
redis.call('HSET', KEYS[1], 'uuid', ARGV[1], 'name', ARGV[2], 'request', ARGV[3],
  'vm_state', ARGV[4], 'task_state', ARGV[5], 'host', '', 'node', '',
  'placement', '', 'claim_id', '', 'domain_xml', '', 'updated_at', ARGV[6])
return {'ok'}
