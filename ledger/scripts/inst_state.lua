-- Moves an instance's vm_state and task_state, only from the states the
-- caller allows; already being in the target states is a retry's success.
-- KEYS: instance
-- ARGV: new vm_state ("" keeps it), new task_state, updated_at,
-- n, n allowed vm_states (none: any), m, m allowed task_states (none: any)
-- Returns {'ok'}, {'same'}, {'unknown'} or {'conflict', vm_state, task_state}.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'vm_state', 'task_state')
if not cur[1] then
  return {'unknown'}
end
local vm, task = cur[1], cur[2] or ''
local wantVM = ARGV[1]
if wantVM == '' then
  wantVM = vm
end
if vm == wantVM and task == ARGV[2] then
  redis.call('HSET', KEYS[1], 'vm_state', vm)
  return {'same'}
end

local function allowed(value, first)
  local n = tonumber(ARGV[first])
  if n == 0 then
    return true
  end
  for i = first + 1, first + n do
    if ARGV[i] == value then
      return true
    end
  end
  return false
end
local n = tonumber(ARGV[4])
if not allowed(vm, 4) or not allowed(task, 5 + n) then
  return {'conflict', vm, task}
end
redis.call('HSET', KEYS[1], 'vm_state', wantVM, 'task_state', ARGV[2], 'updated_at', ARGV[3])
return {'ok'}
