-- Removes a host's keys when nothing is left on it but tombstones of
-- guests evacuated from it: a host that never comes back. A host with a
-- live claim (pending, committed or held), or with tombstones while it is
-- not down, is refused. Removing a removed host changes nothing, but
-- writes one key and deletes it again, so that a wait for durability
-- after this script covers the removal another connection made.
-- KEYS: topo, pins, claims, usage, undo, lease, host state
-- Returns {'ok', tombstones removed}, {'gone'}, {'live', claim id, state}
-- or {'notdown', host state, tombstones}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[1], '')
  redis.call('DEL', KEYS[1])
  return {'gone'}
end
local claims = redis.call('HGETALL', KEYS[3])
local tombstones = 0
for i = 1, #claims, 2 do
  local state = string.match(claims[i + 1], '^{"state":"(%a+)",')
  if state ~= 'tombstone' then
    return {'live', claims[i], state or ''}
  end
  tombstones = tombstones + 1
end
local state = redis.call('HGET', KEYS[7], 'state') or 'up'
if tombstones > 0 and state ~= 'down' then
  return {'notdown', state, tostring(tombstones)}
end
redis.call('DEL', unpack(KEYS))
return {'ok', tostring(tombstones)}
