-- Creates an instance record unless it exists. Creating it again for the
-- same creator, name and request is a retry and succeeds without changing
-- it; another creator is refused.
-- KEYS: instance
-- ARGV: uuid, name, request JSON, vm_state, task_state, updated_at,
-- creator ('' skips the creator check), server group, its policy and its
-- max members per host ('' for none)
-- Returns {'ok'}, {'exists'}, {'other', vm_state} or
-- {'conflict', name, request}.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'name', 'request', 'created_by', 'vm_state', 'group')
if cur[1] then
  if ARGV[7] ~= '' and cur[3] ~= ARGV[7] then
    return {'other', cur[4] or ''}
  end
  if cur[1] == ARGV[2] and cur[2] == ARGV[3] and (cur[5] or '') == ARGV[8] then
    redis.call('HSET', KEYS[1], 'name', cur[1])
    return {'exists'}
  end
  return {'conflict', cur[1], cur[2]}
end
redis.call('HSET', KEYS[1], 'uuid', ARGV[1], 'name', ARGV[2], 'request', ARGV[3],
  'vm_state', ARGV[4], 'task_state', ARGV[5], 'host', '', 'node', '',
  'placement', '', 'claim_id', '', 'domain_xml', '', 'updated_at', ARGV[6],
  'created_by', ARGV[7], 'group', ARGV[8], 'group_policy', ARGV[9], 'group_max', ARGV[10])
return {'ok'}
