-- Writes a host's topology when nothing changed since the caller checked
-- the host's claims against it. A host that has the topology already
-- gets its digest written again, unchanged, so that a wait for durability
-- after this script covers the registration that wrote it, whichever
-- connection made it.
-- KEYS: topo
-- ARGV: topology JSON, its digest, expected generation ("0": a new host),
-- expected claims revision
-- Returns {'ok', gen}, {'same', gen} or {'changed'}.
local cur = redis.call('HMGET', KEYS[1], 'gen', 'rev', 'digest')
if cur[1] and cur[3] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'digest', ARGV[2])
  return {'same', cur[1]}
end
if ARGV[3] == '0' then
  if cur[1] then
    return {'changed'}
  end
elseif cur[1] ~= ARGV[3] or (cur[2] or '0') ~= ARGV[4] then
  -- A claim or release landed, or another registration won: the caller's
  -- check is stale.
  return {'changed'}
end
local gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HSET', KEYS[1], 'topology', ARGV[1], 'digest', ARGV[2])
return {'ok', tostring(gen)}
