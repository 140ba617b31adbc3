-- Writes a host's topology when nothing changed since the caller checked
-- the host's claims against it.
-- KEYS: topo
-- ARGV: topology JSON, its digest, expected generation ("0": a new host),
-- expected claims revision
-- Returns {'ok', gen}, {'same', gen} or {'changed'}.
local cur = redis.call('HMGET', KEYS[1], 'gen', 'rev', 'digest')
if ARGV[3] == '0' then
  if cur[1] then
    return {'changed'}
  end
elseif cur[1] ~= ARGV[3] or (cur[2] or '0') ~= ARGV[4] then
  -- A claim or release landed, or another registration won: the caller's
  -- check is stale.
  return {'changed'}
end
if cur[3] == ARGV[2] then
  return {'same', cur[1]}
end
local gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HSET', KEYS[1], 'topology', ARGV[1], 'digest', ARGV[2])
return {'ok', tostring(gen)}
