-- Moves an existing claim from one state to another: commit (pending to
-- committed), hold (committed to held), unhold (held to committed),
-- reinstate (held to committed, on a host that is neither down nor
-- returning) and tombstone (committed or held to tombstone, on a host
-- that is down). Pins,
-- usage and the undo entry never change: a claim keeps its pCPUs through
-- every state, so a revert, or a guest left behind on a fenced host, finds
-- them as they were.
-- KEYS: claims, host state
-- ARGV: claim id, target state, the states the claim may start from
-- (comma-joined), the time to record as committed_at (a JSON string) when
-- the target is committed and the record has none, and what the host's
-- state must be: 'down', 'live' (neither down nor returning) or '' (any)
-- Returns {'ok', record}, {'unknown'}, {'state', current state} when the
-- claim may not start from its state, or {'host', host state} when the
-- host's state is not the one asked for.
-- A claim in the target state already changes nothing, but its record is
-- written again: a wait for durability after this script counts only its
-- own connection's writes, and so then covers the change another
-- connection made.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return {'unknown'}
end
-- Records are written with "state" as their first member, so the state is
-- changed by replacing that prefix: no JSON round trip in Lua, which would
-- turn empty arrays into objects.
local cur = string.match(record, '^{"state":"(%a+)",')
local to = ARGV[2]
if cur == to then
  redis.call('HSET', KEYS[1], ARGV[1], record)
  return {'ok', record}
end
local allowed = false
for s in string.gmatch(ARGV[3], '[^,]+') do
  if s == cur then
    allowed = true
  end
end
if not allowed then
  return {'state', cur or ''}
end
if ARGV[5] ~= '' then
  -- A host that came back may run the guest again: its claim is not dead.
  -- A guest runs again only on a host that is not fenced or coming back.
  local host = redis.call('HGET', KEYS[2], 'state') or 'up'
  local live = host ~= 'down' and host ~= 'returning'
  if (ARGV[5] == 'down' and host ~= 'down') or (ARGV[5] == 'live' and not live) then
    return {'host', host}
  end
end
local rest = string.sub(record, #'{"state":"",' + #cur + 1)
local at = '"committed_at":'
if to == 'committed' and string.sub(rest, 1, #at) ~= at then
  rest = at .. ARGV[4] .. ',' .. rest
end
record = '{"state":"' .. to .. '",' .. rest
redis.call('HSET', KEYS[1], ARGV[1], record)
return {'ok', record}
