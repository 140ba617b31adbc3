-- Applies a batch of claims and releases to one host, in order, each one
-- whole or not at all. Concurrent callers' operations on one host share one
-- script (group commit): its reads and writes are paid once per batch, not
-- once per operation. Every operation sees the changes of those before it,
-- exactly as if each were a script of its own.
-- KEYS: topo, pins, claims, usage
-- ARGV: the number of operations, then each operation:
--   'c', claim id, claim record (JSON ending in its undo entry, see below),
--        the topology generation the caller fitted against, n, n pCPU ids,
--        m, then m times: usage field, amount to add, and the cap the field
--        may reach or '' for none
--   'r', claim id, token ('' releases whatever the token)
-- Returns one reply per operation.
--   A claim: {'ok', rev, the m fields' new values}, {'exists', record},
--   {'nohost'}, {'gen', current}, or why it lost a race followed by the
--   host's state, so the caller re-fits without reading it again:
--   {'taken', rev, pins, usage, cpu, owner} or
--   {'full', rev, pins, usage, field, used, want, cap}, where pins are the
--   pinned pCPUs and usage the counters as field,value pairs, comma-joined,
--   as of rev (the end of this script).
--   A release: {1, rev, freed pCPUs, changed counters} (comma-joined, the
--   counters as field,value pairs), {0} when there is no such claim, {2}
--   when the token did not match (nothing released).
local topo, pinsKey, claimsKey, usageKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- Locals: a global lookup per use adds up over a batch.
local ARGV, call, tonumber, unpack, ipairs, pairs = ARGV, redis.call, tonumber, unpack, ipairs, pairs
local find, sub, match, gmatch, concat = string.find, string.sub, string.match, string.gmatch, table.concat

-- Lua's unpack takes a few thousand values at most; big batches of big
-- guests are read and written in slices.
local SLICE = 1000
local function each_slice(list, fn)
  for i = 1, #list, SLICE do
    fn(unpack(list, i, math.min(i + SLICE - 1, #list)))
  end
end
local function hmget(key, names)
  local out = {}
  each_slice(names, function(...)
    local got = call('HMGET', key, ...)
    for j = 1, #got do
      out[#out + 1] = got[j]
    end
  end)
  return out
end

-- A claim record ends in its undo entry, "undo":"token|pCPUs|field,n,...":
-- what the claim took, so a release decodes no JSON.
local undone = {}
local function undo(record)
  local u = undone[record]
  if u then
    return u
  end
  u = {cpus = {}, fields = {}, counts = {}}
  -- A plain search (a pattern would be tried at every position): inside a
  -- JSON string a quote is escaped, so only the member itself matches.
  local at = find(record, ',"undo":"', 1, true)
  local bar1 = at and find(record, '|', at + 9, true)
  local bar2 = bar1 and find(record, '|', bar1 + 1, true)
  if bar2 and sub(record, -2) == '"}' then
    u.token = sub(record, at + 9, bar1 - 1)
    local cpus, fields, counts = u.cpus, u.fields, u.counts
    for cpu in gmatch(sub(record, bar1 + 1, bar2 - 1), '%d+') do
      cpus[#cpus + 1] = cpu
    end
    for f, n in gmatch(sub(record, bar2 + 1, -3), '([^,]+),(%d+)') do
      fields[#fields + 1] = f
      counts[#counts + 1] = tonumber(n)
    end
  else
    -- A record without an undo entry predates them: read it from the JSON.
    local claim = cjson.decode(record)
    u.token = claim.token
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
  end
  undone[record] = u
  return u
end

-- Parse the operations.
local ops, k = {}, 2
for i = 1, tonumber(ARGV[1]) do
  if ARGV[k] == 'c' then
    local n = tonumber(ARGV[k + 4])
    local at = k + 5 + n
    local m = tonumber(ARGV[at])
    ops[i] = {claim = true, id = ARGV[k + 1], rec = ARGV[k + 2], gen = ARGV[k + 3], cpu = k + 5, n = n, field = at + 1, m = m}
    k = at + 1 + 3 * m
  else
    ops[i] = {id = ARGV[k + 1], token = ARGV[k + 2]}
    k = k + 3
  end
end

-- Read everything the batch can touch, once: each redis.call costs more
-- than the Lua around it. recs, owners and used hold the host's state as
-- the operations change it (false: none); dirty says what to write back.
local t = call('HMGET', topo, 'gen', 'rev')
local gen, rev = t[1], tonumber(t[2]) or 0
local recs, owners, used = {}, {}, {}
local ids, seen = {}, {}
for _, o in ipairs(ops) do
  if not seen[o.id] then
    seen[o.id] = true
    ids[#ids + 1] = o.id
  end
end
local got = hmget(claimsKey, ids)
for j, id in ipairs(ids) do
  recs[id] = got[j]
end
local cpus, fields = {}, {}
local function want_cpu(cpu)
  if owners[cpu] == nil then
    owners[cpu] = false
    cpus[#cpus + 1] = cpu
  end
end
local function want_field(f)
  if used[f] == nil then
    used[f] = false
    fields[#fields + 1] = f
  end
end
for _, o in ipairs(ops) do
  if o.claim then
    for j = o.cpu, o.cpu + o.n - 1 do
      want_cpu(ARGV[j])
    end
    for j = 0, o.m - 1 do
      want_field(ARGV[o.field + 3 * j])
    end
  elseif recs[o.id] then
    local u = undo(recs[o.id])
    for _, cpu in ipairs(u.cpus) do
      want_cpu(cpu)
    end
    for _, f in ipairs(u.fields) do
      want_field(f)
    end
  end
end
got = hmget(pinsKey, cpus)
for j, cpu in ipairs(cpus) do
  owners[cpu] = got[j]
end
got = hmget(usageKey, fields)
for j, f in ipairs(fields) do
  used[f] = tonumber(got[j] or '0')
end

local dirtyPins, dirtyUsage, dirtyRecs = {}, {}, {}
local losers = {}

local function lost(reason, ...)
  local reply = {reason, 0, '', '', ...}
  losers[#losers + 1] = reply
  return reply
end

-- Check everything before changing anything: an operation that fails half
-- way would leave half a claim behind.
local function claim(o)
  if recs[o.id] then
    -- A retried claim gets the first result back.
    return {'exists', recs[o.id]}
  end
  if not gen then
    return {'nohost'}
  end
  -- The caps come from the caller's copy of the topology; they are only
  -- valid for the generation it fitted against.
  if gen ~= o.gen then
    return {'gen', gen}
  end
  for j = o.cpu, o.cpu + o.n - 1 do
    local owner = owners[ARGV[j]]
    if owner then
      return lost('taken', ARGV[j], owner)
    end
  end
  for j = 0, o.m - 1 do
    local at = o.field + 3 * j
    local cap = ARGV[at + 2]
    if cap ~= '' and used[ARGV[at]] + tonumber(ARGV[at + 1]) > tonumber(cap) then
      return lost('full', ARGV[at], tostring(used[ARGV[at]]), ARGV[at + 1], cap)
    end
  end
  for j = o.cpu, o.cpu + o.n - 1 do
    owners[ARGV[j]] = o.id
    dirtyPins[ARGV[j]] = true
  end
  local reply = {'ok', 0}
  for j = 0, o.m - 1 do
    local at = o.field + 3 * j
    local f = ARGV[at]
    used[f] = used[f] + tonumber(ARGV[at + 1])
    dirtyUsage[f] = true
    reply[j + 3] = used[f]
  end
  recs[o.id] = o.rec
  dirtyRecs[o.id] = true
  -- rev tells a re-registration that the claims it checked have changed,
  -- and orders the replies that caches learn the host's state from.
  rev = rev + 1
  reply[2] = rev
  return reply
end

local function release(o)
  local record = recs[o.id]
  if not record then
    -- Already released, or never made: releasing is idempotent.
    return {0}
  end
  local u = undo(record)
  if o.token ~= '' and u.token ~= o.token then
    return {2}
  end
  -- Only unpin what this claim owns: a pin is never taken from another
  -- owner, whatever the record says.
  local freed = {}
  for _, cpu in ipairs(u.cpus) do
    if owners[cpu] == o.id then
      owners[cpu] = false
      dirtyPins[cpu] = true
      freed[#freed + 1] = cpu
    end
  end
  -- Usage never goes below zero.
  local counters = {}
  for j, f in ipairs(u.fields) do
    local left = used[f] - u.counts[j]
    if left < 0 then
      left = 0
    end
    used[f] = left
    dirtyUsage[f] = true
    counters[2 * j - 1], counters[2 * j] = f, left
  end
  recs[o.id] = false
  dirtyRecs[o.id] = true
  rev = rev + 1
  return {1, rev, concat(freed, ','), concat(counters, ',')}
end

local replies = {}
for i, o in ipairs(ops) do
  if o.claim then
    replies[i] = claim(o)
  else
    replies[i] = release(o)
  end
end

-- Write back what changed: one HSET and one HDEL per key. A usage field at
-- zero is removed, so an empty host has no usage key at all.
local function write(key, dirty, value, counts)
  local set, gone = {}, {}
  for name in pairs(dirty) do
    local v = value[name]
    if v and (not counts or v > 0) then
      set[#set + 1] = name
      set[#set + 1] = v
    else
      gone[#gone + 1] = name
    end
  end
  each_slice(set, function(...) call('HSET', key, ...) end)
  each_slice(gone, function(...) call('HDEL', key, ...) end)
end
write(pinsKey, dirtyPins, owners)
write(usageKey, dirtyUsage, used, true)
write(claimsKey, dirtyRecs, recs)
if rev ~= (tonumber(t[2]) or 0) then
  call('HSET', topo, 'rev', rev)
end

-- Losers get the state as of the end of the batch: the newest there is.
if #losers > 0 then
  local pins = concat(call('HKEYS', pinsKey), ',')
  local usage = concat(call('HGETALL', usageKey), ',')
  for _, reply in ipairs(losers) do
    reply[2], reply[3], reply[4] = rev, pins, usage
  end
end
return replies
