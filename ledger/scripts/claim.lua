-- Claims a placement's usage on one host: either every pCPU, page and MiB is
-- recorded for the claim together with its record, or nothing changes.
-- KEYS: topo, pins, claims, usage
-- ARGV: claim id, claim record (JSON, ending in its undo entry: see
-- release.lua), the topology generation the caller fitted against, n,
-- then n pCPU ids, m, then m times: usage field, amount to add, and the
-- cap the field may reach or '' for none.
-- Returns {'ok', rev, the m fields' new values}, {'exists', record},
-- {'nohost'}, {'gen', current}, or why it lost a race followed by the
-- host's state, so the caller re-fits without reading it again:
-- {'taken', rev, pins, usage, cpu, owner} or
-- {'full', rev, pins, usage, field, used, want, cap}, where pins are the
-- pinned pCPUs and usage the counters as field,value pairs, comma-joined.
local topo, pins, claims, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]

-- Every redis.call costs more than the Lua around it, so the script reads
-- each key once, writes each key once, and checks for an existing claim
-- only where it must: a retried claim must get the first result back, even
-- when an earlier try landed after the caller last saw the host, so every
-- refusal looks first, and the claim record is written with HSETNX.
local function exists()
  local record = redis.call('HGET', claims, id)
  if record then
    return {'exists', record}
  end
end

local t = redis.call('HMGET', topo, 'gen', 'rev')
if not t[1] then
  return exists() or {'nohost'}
end
-- The caps below come from the caller's copy of the topology; they are
-- only valid for the generation it fitted against.
if t[1] ~= ARGV[3] then
  return exists() or {'gen', t[1]}
end

local function lost(reason, ...)
  return exists() or {reason, t[2] or '0', table.concat(redis.call('HKEYS', pins), ','),
    table.concat(redis.call('HGETALL', usage), ','), ...}
end

-- Check everything before writing anything: a script that fails half way
-- would leave half a claim behind.
local n = tonumber(ARGV[4])
if n > 0 then
  local owners = redis.call('HMGET', pins, unpack(ARGV, 5, 4 + n))
  for j = 1, n do
    if owners[j] then
      return lost('taken', ARGV[4 + j], owners[j])
    end
  end
end
local base = 5 + n
local m = tonumber(ARGV[base])
local fields, set, out = {}, {}, {'ok', 0}
for j = 1, m do
  fields[j] = ARGV[base + 3 * j - 2]
end
if m > 0 then
  local used = redis.call('HMGET', usage, unpack(fields))
  for j = 1, m do
    local k = base + 3 * j - 2
    local u = tonumber(used[j] or '0')
    local want, cap = tonumber(ARGV[k + 1]), ARGV[k + 2]
    if cap ~= '' and u + want > tonumber(cap) then
      return lost('full', fields[j], tostring(u), ARGV[k + 1], cap)
    end
    set[2 * j - 1], set[2 * j] = fields[j], u + want
    out[j + 2] = u + want
  end
end

if redis.call('HSETNX', claims, id, ARGV[2]) == 0 then
  return exists()
end
if n > 0 then
  local args = {}
  for j = 1, n do
    args[2 * j - 1], args[2 * j] = ARGV[4 + j], id
  end
  redis.call('HSET', pins, unpack(args))
end
if m > 0 then
  redis.call('HSET', usage, unpack(set))
end
-- rev tells a re-registration that the claims it checked have changed, and
-- orders the replies that caches learn the host's state from.
out[2] = (tonumber(t[2]) or 0) + 1
redis.call('HSET', topo, 'rev', out[2])
return out
