-- Claims a placement's usage on one host: either every pCPU, page and MiB is
-- recorded for the claim together with its record, or nothing changes.
-- KEYS: topo, pins, claims, usage
-- ARGV: claim id, claim record (JSON), the topology generation the caller
-- fitted against, the number of cells, then per cell:
--   cell, memory MiB, shared vCPUs, page size KiB, pages, dedicated (0/1),
--   strict pages (0/1), cell memory MiB, pages available (total - reserved),
--   n, then n pCPU ids
-- Returns {'ok'}, {'exists', record}, {'nohost'}, {'gen', current}, or why
-- it lost a race: {'taken', cpu, owner}, {'memory', cell, used, want, cap},
-- {'pages', cell, size, used, want, cap}.
local topo, pins, claims, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]

-- A retried claim must get the first result back, even when an earlier try
-- landed after the caller last read the host.
local existing = redis.call('HGET', claims, id)
if existing then
  return {'exists', existing}
end

local gen = redis.call('HGET', topo, 'gen')
if not gen then
  return {'nohost'}
end
-- The capacities below come from the caller's copy of the topology; they
-- are only valid for the generation it fitted against.
if gen ~= ARGV[3] then
  return {'gen', gen}
end

local cells, i = {}, 5
for c = 1, tonumber(ARGV[4]) do
  local u = {
    cell = ARGV[i], mem = tonumber(ARGV[i + 1]), shared = tonumber(ARGV[i + 2]),
    size = ARGV[i + 3], pages = tonumber(ARGV[i + 4]),
    dedicated = ARGV[i + 5] == '1', strict = ARGV[i + 6] == '1',
    memcap = tonumber(ARGV[i + 7]), pagecap = tonumber(ARGV[i + 8]), cpus = {},
  }
  local n = tonumber(ARGV[i + 9])
  for j = 1, n do
    u.cpus[j] = ARGV[i + 9 + j]
  end
  i = i + 10 + n
  cells[c] = u
end

-- Check everything before writing anything: a script that fails half way
-- would leave half a claim behind.
for _, u in ipairs(cells) do
  if #u.cpus > 0 then
    local owners = redis.call('HMGET', pins, unpack(u.cpus))
    for j, owner in ipairs(owners) do
      if owner then
        return {'taken', u.cpus[j], owner}
      end
    end
  end
  if u.strict and u.pages > 0 then
    local used = tonumber(redis.call('HGET', usage, u.cell .. ':pages:' .. u.size) or '0')
    if used + u.pages > u.pagecap then
      return {'pages', u.cell, u.size, tostring(used), tostring(u.pages), tostring(u.pagecap)}
    end
  end
  if u.dedicated and u.mem > 0 then
    local used = tonumber(redis.call('HGET', usage, u.cell .. ':mem') or '0')
    if used + u.mem > u.memcap then
      return {'memory', u.cell, tostring(used), tostring(u.mem), tostring(u.memcap)}
    end
  end
end

for _, u in ipairs(cells) do
  if #u.cpus > 0 then
    local args = {}
    for _, cpu in ipairs(u.cpus) do
      args[#args + 1] = cpu
      args[#args + 1] = id
    end
    redis.call('HSET', pins, unpack(args))
  end
  if u.mem ~= 0 then
    redis.call('HINCRBY', usage, u.cell .. ':mem', u.mem)
  end
  if u.shared ~= 0 then
    redis.call('HINCRBY', usage, u.cell .. ':shared', u.shared)
  end
  if u.pages ~= 0 and u.size ~= '0' then
    redis.call('HINCRBY', usage, u.cell .. ':pages:' .. u.size, u.pages)
  end
end
redis.call('HSET', claims, id, ARGV[2])
-- rev tells a re-registration that the claims it checked have changed.
redis.call('HINCRBY', topo, 'rev', 1)
return {'ok'}
