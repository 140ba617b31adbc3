-- Frees a claim's pins and usage and deletes its record, in one step.
-- KEYS: topo, pins, claims, usage
-- ARGV: claim id, token ("" releases whatever the token)
-- Returns {1, rev, freed pCPUs, counters} when it released, where freed
-- pCPUs are comma-joined and counters the changed usage fields and their
-- new values as comma-joined pairs; {0} when there was no such claim; {2}
-- when the token did not match (nothing released).
local topo, pins, claims, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token = ARGV[1], ARGV[2]

local record = redis.call('HGET', claims, id)
if not record then
  -- Already released, or never made: releasing is idempotent.
  return {0}
end
-- The record ends in its undo entry, "undo":"token|pCPUs|field,n,...":
-- what the claim took, so releasing decodes no JSON.
local tok, cpus, deltas = nil, {}, {}
-- A plain search (a pattern would be tried at every position): inside a
-- JSON string a quote is escaped, so only the member itself matches.
local entry
local at = string.find(record, ',"undo":"', 1, true)
if at and string.sub(record, -2) == '"}' then
  entry = string.sub(record, at + 9, -3)
end
if entry then
  local list, counts
  tok, list, counts = string.match(entry, '^([^|]*)|([^|]*)|(.*)$')
  for cpu in string.gmatch(list, '[^,]+') do
    cpus[#cpus + 1] = cpu
  end
  for f, n in string.gmatch(counts, '([^,]+),([^,]+)') do
    local d = #deltas
    deltas[d + 1], deltas[d + 2] = f, tonumber(n)
  end
else
  -- A record without an undo entry predates them: read it from the JSON.
  local claim = cjson.decode(record)
  tok = claim.token
  for _, u in ipairs(claim.usage) do
    -- Pinned CPUs are stored in cpuset-list form, e.g. "0-3,8".
    for part in string.gmatch(u.pinned_cpus or '', '[^,]+') do
      local lo, hi = string.match(part, '^(%d+)-(%d+)$')
      if lo then
        for c = tonumber(lo), tonumber(hi) do
          cpus[#cpus + 1] = tostring(c)
        end
      else
        cpus[#cpus + 1] = part
      end
    end
    local cell = tostring(u.cell)
    local function add(field, n)
      if n ~= nil and n ~= 0 then
        local d = #deltas
        deltas[d + 1], deltas[d + 2] = field, n
      end
    end
    add(cell .. ':mem', u.memory_mb)
    add(cell .. ':shared', u.shared_cpus)
    if u.page_size_kb and u.page_size_kb ~= 0 then
      add(cell .. ':pages:' .. string.format('%d', u.page_size_kb), u.pages)
    end
  end
end
if token ~= '' and tok ~= token then
  return {2}
end

-- Only unpin what this claim owns: a pin is never taken from another
-- owner, whatever the record says.
local freed = {}
if #cpus > 0 then
  local owners = redis.call('HMGET', pins, unpack(cpus))
  for j, owner in ipairs(owners) do
    if owner == id then
      freed[#freed + 1] = cpus[j]
    end
  end
  if #freed > 0 then
    redis.call('HDEL', pins, unpack(freed))
  end
end
-- Usage never goes below zero, and a field at zero is removed, so an empty
-- host has no usage key at all. One read and one write for all fields:
-- each redis.call costs more than the Lua around it.
local counters = {}
if #deltas > 0 then
  local fields = {}
  for j = 1, #deltas, 2 do
    fields[#fields + 1] = deltas[j]
  end
  local used = redis.call('HMGET', usage, unpack(fields))
  local set, gone = {}, {}
  for j, f in ipairs(fields) do
    local left = tonumber(used[j] or '0') - deltas[2 * j]
    if left > 0 then
      set[#set + 1] = f
      set[#set + 1] = left
    else
      gone[#gone + 1] = f
      left = 0
    end
    counters[2 * j - 1], counters[2 * j] = f, left
  end
  if #set > 0 then
    redis.call('HSET', usage, unpack(set))
  end
  if #gone > 0 then
    redis.call('HDEL', usage, unpack(gone))
  end
end
redis.call('HDEL', claims, id)
local rev = redis.call('HINCRBY', topo, 'rev', 1)
return {1, rev, table.concat(freed, ','), table.concat(counters, ',')}
