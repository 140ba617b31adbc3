-- Reads what a claim needs to fit, in one atomic step so the pins and the
-- usage agree with each other.
-- KEYS: topo, pins, claims, usage
-- ARGV: the topology digest the caller has cached, a claim id or ""
-- Returns {gen, digest, topology or false, rev, pinned pCPUs comma-joined,
-- usage as comma-joined field,value pairs, the claim's record or false},
-- or {} for an unknown host.
local t = redis.call('HMGET', KEYS[1], 'gen', 'digest', 'rev')
if not t[1] then
  return {}
end
-- The topology changes rarely; send it only when the caller's copy is stale.
local topology = false
if t[2] ~= ARGV[1] then
  topology = redis.call('HGET', KEYS[1], 'topology')
end
local existing = false
if ARGV[2] ~= '' then
  existing = redis.call('HGET', KEYS[3], ARGV[2])
end
-- Strings instead of arrays of every pinned pCPU and counter: a busy host
-- has hundreds, and each array element costs the server a reply of its own.
local pins = table.concat(redis.call('HKEYS', KEYS[2]), ',')
local usage = table.concat(redis.call('HGETALL', KEYS[4]), ',')
return {t[1], t[2], topology, t[3] or '0', pins, usage, existing}
