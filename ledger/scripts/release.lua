-- Releases one claim on a host: unpins its pCPUs, takes its usage off the
-- counters and deletes its record, undo entry and fence lease.
-- KEYS: topo, pins, claims, usage, undo, lease, host state (hostKeys.all)
-- ARGV: claim id, token ('' releases whatever the token), condition:
--   '' none; 'pending' only a pending claim (a compensation must never
--   free a claim that became resident); or 'unchanged:STATE' only a claim
--   in STATE whose fence lease has run out (the audit decided on the claim
--   as it was, and a fenced hypervisor step may be acting for it right
--   now)
-- Returns {1, rev, freed pCPUs, changed counters} (comma-joined, the
--   counters as field,value pairs), {0} when there is no such claim, {2}
--   when the token did not match, {3} when the condition did not hold
--   (nothing released).
--
-- A reply of 0, 2 or 3 rests on an earlier change (the release already
-- made, the claim made again or changed) and writes the host's rev again,
-- unchanged: the wait for durability after the script counts only the
-- writes of its own connection, and so then covers that change, made on
-- whichever.
--
-- The undo hash holds, beside each claim record, what the claim took:
-- "token|pCPUs|field,n,field,n". A release reads that short entry instead
-- of the record: every string that enters Lua is hashed byte by byte, and
-- a record is a hundred times longer.
local topo, pinsKey, claimsKey, usageKey, undoKey, leaseKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local call = redis.call
local find, sub, match, gmatch = string.find, string.sub, string.match, string.gmatch
local id, token, cond = ARGV[1], ARGV[2], ARGV[3]

-- parse reads an undo entry, "token|pCPUs|field,n,...", into
-- {token, cpus, fields, counts}; nil if it is not one.
local function parse(entry, from, to)
  local bar1 = find(entry, '|', from, true)
  local bar2 = bar1 and find(entry, '|', bar1 + 1, true)
  if not bar2 or bar2 > to then
    return nil
  end
  local u = {token = sub(entry, from, bar1 - 1), cpus = {}, fields = {}, counts = {}}
  for cpu in gmatch(sub(entry, bar1 + 1, bar2 - 1), '%d+') do
    u.cpus[#u.cpus + 1] = cpu
  end
  for f, n in gmatch(sub(entry, bar2 + 1, to), '([^,]+),(%d+)') do
    u.fields[#u.fields + 1] = f
    u.counts[#u.counts + 1] = tonumber(n)
  end
  return u
end

-- legacy reads what a claim took from a record written before the undo
-- hash: from the undo member at its end, or else from its JSON.
local function legacy(record)
  -- A plain search (a pattern would be tried at every position): inside a
  -- JSON string a quote is escaped, so only the member itself matches.
  local at = find(record, ',"undo":"', 1, true)
  if at and sub(record, -2) == '"}' then
    local u = parse(record, at + 9, #record - 2)
    if u then
      return u
    end
  end
  local claim = cjson.decode(record)
  local u = {token = claim.token, cpus = {}, fields = {}, counts = {}}
  for _, cu in ipairs(claim.usage) do
    -- Pinned CPUs are stored in cpuset-list form, e.g. "0-3,8".
    for part in gmatch(cu.pinned_cpus or '', '[^,]+') do
      local lo, hi = match(part, '^(%d+)-(%d+)$')
      if lo then
        for c = tonumber(lo), tonumber(hi) do
          u.cpus[#u.cpus + 1] = tostring(c)
        end
      else
        u.cpus[#u.cpus + 1] = part
      end
    end
    local cell = tostring(cu.cell)
    local function add(field, n)
      if n ~= nil and n ~= 0 then
        u.fields[#u.fields + 1] = field
        u.counts[#u.counts + 1] = n
      end
    end
    add(cell .. ':mem', cu.memory_mb)
    add(cell .. ':shared', cu.shared_cpus)
    if cu.page_size_kb and cu.page_size_kb ~= 0 then
      add(cell .. ':pages:' .. string.format('%d', cu.page_size_kb), cu.pages)
    end
  end
  -- What the claim took of the host as a whole (ledger's hostMemField and
  -- hostVCPUsField); a record without it took none.
  local hu = claim.host_usage
  if type(hu) == 'table' then
    if hu.memory_mb and hu.memory_mb ~= 0 then
      u.fields[#u.fields + 1], u.counts[#u.counts + 1] = 'host:mem', hu.memory_mb
    end
    if hu.vcpus and hu.vcpus ~= 0 then
      u.fields[#u.fields + 1], u.counts[#u.counts + 1] = 'host:vcpus', hu.vcpus
    end
  end
  return u
end

-- holds says whether the condition holds for the claim.
local function holds()
  -- The record starts with the claim's state.
  local state = match(call('HGET', claimsKey, id) or '', '^{"state":"(%a+)"')
  if cond == 'pending' then
    return state == 'pending'
  end
  local want = match(cond, '^unchanged:(%a+)$')
  if not want or state ~= want then
    return false
  end
  -- A fenced step may act for the claim until its lease ends, by the
  -- server's clock.
  local lease = call('HGET', leaseKey, id)
  if lease then
    local until_ms = tonumber(match(lease, '|(%d+)$'))
    local t = call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if until_ms and until_ms > now then
      return false
    end
  end
  return true
end

local t = call('HMGET', topo, 'gen', 'rev')
local gen, rev = t[1], tonumber(t[2]) or 0

-- rest returns a reply that rests on an earlier change: see the header.
local function rest(reply)
  if gen then
    call('HSET', topo, 'rev', rev)
  end
  return reply
end

local u
local entry = call('HGET', undoKey, id)
if entry then
  u = parse(entry, 1, #entry) or {token = '', cpus = {}, fields = {}, counts = {}}
else
  -- A record without an undo entry was written before there were any.
  local record = call('HGET', claimsKey, id)
  if not record then
    -- Already released, or never made: releasing is idempotent.
    return rest({0})
  end
  u = legacy(record)
end
if token ~= '' and u.token ~= token then
  return rest({2})
end
if cond ~= '' and not holds() then
  return rest({3})
end

-- Only unpin what this claim owns: a pin is never taken from another
-- owner, whatever the record says. A pCPU listed twice is freed once.
local owners = sliced('HMGET', pinsKey, u.cpus)
local freed, seen = {}, {}
for j, cpu in ipairs(u.cpus) do
  if owners[j] == id and not seen[cpu] then
    seen[cpu] = true
    freed[#freed + 1] = cpu
  end
end
-- Usage never goes below zero.
local got = sliced('HMGET', usageKey, u.fields)
local used = {}
for j, f in ipairs(u.fields) do
  used[f] = tonumber(got[j]) or 0
end
local counters = {}
for j, f in ipairs(u.fields) do
  used[f] = math.max(used[f] - u.counts[j], 0)
  counters[#counters + 1] = f
  counters[#counters + 1] = used[f]
end
sliced('HDEL', pinsKey, freed)
writeUsage(usageKey, used)
call('HDEL', claimsKey, id)
call('HDEL', undoKey, id)
call('HDEL', leaseKey, id)
rev = rev + 1
call('HSET', topo, 'rev', rev)
return {1, rev, table.concat(freed, ','), table.concat(counters, ',')}
