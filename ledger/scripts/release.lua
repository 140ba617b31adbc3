-- Frees a claim's pins and usage and deletes its record, in one step.
-- KEYS: topo, pins, claims, usage
-- ARGV: claim id, token ("" releases whatever the token)
-- Returns 1 when it released, 0 when there was no such claim, 2 when the
-- token did not match (nothing released).
local topo, pins, claims, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token = ARGV[1], ARGV[2]

local record = redis.call('HGET', claims, id)
if not record then
  -- Already released, or never made: releasing is idempotent.
  return 0
end
local claim = cjson.decode(record)
if token ~= '' and claim.token ~= token then
  return 2
end

-- Pinned CPUs are stored in cpuset-list form, e.g. "0-3,8".
local function cpus(list)
  local out = {}
  for part in string.gmatch(list, '[^,]+') do
    local lo, hi = string.match(part, '^(%d+)-(%d+)$')
    if lo then
      for c = tonumber(lo), tonumber(hi) do
        out[#out + 1] = tostring(c)
      end
    else
      out[#out + 1] = part
    end
  end
  return out
end

-- Usage never goes below zero, and a field at zero is removed, so an empty
-- host has no usage key at all.
local function sub(field, n)
  if n == nil or n == 0 then
    return
  end
  local left = redis.call('HINCRBY', usage, field, -n)
  if left <= 0 then
    redis.call('HDEL', usage, field)
  end
end

for _, u in ipairs(claim.usage) do
  local list = cpus(u.pinned_cpus or '')
  if #list > 0 then
    -- Only unpin what this claim owns: a pin is never taken from another
    -- owner, whatever the record says.
    local owners = redis.call('HMGET', pins, unpack(list))
    for j, owner in ipairs(owners) do
      if owner == id then
        redis.call('HDEL', pins, list[j])
      end
    end
  end
  local cell = tostring(u.cell)
  sub(cell .. ':mem', u.memory_mb)
  sub(cell .. ':shared', u.shared_cpus)
  if u.page_size_kb and u.page_size_kb ~= 0 then
    sub(cell .. ':pages:' .. string.format('%d', u.page_size_kb), u.pages)
  end
end
redis.call('HDEL', claims, id)
redis.call('HINCRBY', topo, 'rev', 1)
return 1
