-- Applies a batch of claims and releases to one host, in order, each one
-- whole or not at all. Concurrent callers' operations on one host share one
-- script (group commit): its reads and writes are paid once per batch, not
-- once per operation. Every operation sees the changes of those before it,
-- exactly as if each were a script of its own.
-- KEYS: topo, pins, claims, usage, undo, lease, host state
-- ARGV: the number of operations, then each operation:
--   'c', claim id, claim record (JSON), undo entry (see below), the
--        topology generation the caller fitted against, n, n pCPU ids, m,
--        then m times: usage field, amount to add, and the cap the field
--        may reach or '' for none. The caps are every limit numa.Fit
--        holds the counter to on that generation's topology (dedicated
--        memory, memory and shared vCPUs to the allocation ratios, strict
--        pages to the pool less its reserved pages), computed by the
--        caller once per topology; this script alone judges them against
--        the host's counters, so no view a caller fitted on can place
--        past them
--   'r', claim id, token ('' releases whatever the token), condition:
--        '' none; 'pending' only a pending claim (a compensation must
--        never free a claim that became resident); or 'unchanged:STATE'
--        only a claim in STATE whose fence lease has run out (the audit
--        decided on the claim as it was, and a fenced hypervisor step may
--        be acting for it right now)
-- Returns one reply per operation.
--   A claim: {'ok', rev, the m fields' new values}, {'exists', record},
--   {'nohost'}, {'down', host state} (an operator fenced the host, or it
--   is returning: it takes no new claims; a disabled host takes them, as
--   only an operation that names it claims there), {'gen', current}, or why it
--   lost a race followed by the host's state, so the caller re-fits
--   without reading it again:
--   {'taken', rev, pins, usage, cpu, owner} or
--   {'full', rev, pins, usage, field, used, want, cap}, where pins are the
--   pinned pCPUs and usage the counters as field,value pairs, comma-joined,
--   as of rev (the end of this script).
--   A release: {1, rev, freed pCPUs, changed counters} (comma-joined, the
--   counters as field,value pairs), {0} when there is no such claim, {2}
--   when the token did not match, {3} when the condition did not hold
--   (nothing released).
--
-- A batch whose replies rest on earlier changes and that changes nothing
-- itself (a retried claim that exists, a release of a claim gone) writes
-- the host's rev again, unchanged: the wait for durability that follows
-- the script counts only the writes of its own connection, and so then
-- covers the change another connection made.
--
-- The undo hash holds, beside each claim record, what the claim took:
-- "token|pCPUs|field,n,field,n". A release reads that short entry instead
-- of the record: every string that enters Lua is hashed byte by byte, and
-- a record is a hundred times longer.
local topo, pinsKey, claimsKey, usageKey, undoKey, leaseKey, stateKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
-- Locals: a global lookup per use adds up over a batch.
local ARGV, call, tonumber, unpack, ipairs, pairs = ARGV, redis.call, tonumber, unpack, ipairs, pairs
local find, sub, match, gmatch, concat = string.find, string.sub, string.match, string.gmatch, table.concat

-- Lua's unpack takes a few thousand values at most; big batches of big
-- guests are read and written in slices.
local SLICE = 1000
local function run(cmd, key, list)
  if #list <= SLICE then
    return call(cmd, key, unpack(list))
  end
  local out = {}
  for i = 1, #list, SLICE do
    local got = call(cmd, key, unpack(list, i, math.min(i + SLICE - 1, #list)))
    if type(got) == 'table' then
      for j = 1, #got do
        out[#out + 1] = got[j]
      end
    end
  end
  return out
end

-- parse reads an undo entry, "token|pCPUs|field,n,...", into
-- {token, cpus, fields, counts}; nil if it is not one.
local function parse(entry, from, to)
  local bar1 = find(entry, '|', from, true)
  local bar2 = bar1 and find(entry, '|', bar1 + 1, true)
  if not bar2 or bar2 > to then
    return nil
  end
  local u = {token = sub(entry, from, bar1 - 1), cpus = {}, fields = {}, counts = {}}
  local cpus, fields, counts = u.cpus, u.fields, u.counts
  for cpu in gmatch(sub(entry, bar1 + 1, bar2 - 1), '%d+') do
    cpus[#cpus + 1] = cpu
  end
  for f, n in gmatch(sub(entry, bar2 + 1, to), '([^,]+),(%d+)') do
    fields[#fields + 1] = f
    counts[#counts + 1] = tonumber(n)
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
  return u
end

-- The operations start at ARGV[at[i]] (the claim id); isclaim[i] says
-- which kind each is. The code below indexes ARGV directly: every table or
-- call per operation shows in a batch's time.
local nops = tonumber(ARGV[1])
local at, isclaim = {}, {}
local anyClaim = false
-- held maps each claim id to what it holds (its parsed undo entry) or
-- false, owners each pCPU to its claim or false, used each counter to its
-- value, all as the operations change them; ids, cpus and fields list what
-- to read first.
local held, owners, used = {}, {}, {}
local ids, cpus, fields = {}, {}, {}
local k = 2
for i = 1, nops do
  local id = ARGV[k + 1]
  at[i] = k + 1
  if held[id] == nil then
    held[id] = false
    ids[#ids + 1] = id
  end
  if ARGV[k] == 'c' then
    isclaim[i] = true
    anyClaim = true
    local n = tonumber(ARGV[k + 5])
    for j = k + 6, k + 5 + n do
      local cpu = ARGV[j]
      if owners[cpu] == nil then
        owners[cpu] = false
        cpus[#cpus + 1] = cpu
      end
    end
    local mpos = k + 6 + n
    k = mpos + 1 + 3 * tonumber(ARGV[mpos])
    for j = mpos + 1, k - 1, 3 do
      local f = ARGV[j]
      if used[f] == nil then
        used[f] = false
        fields[#fields + 1] = f
      end
    end
  else
    k = k + 4
  end
end

-- Read everything the batch can touch, once: each redis.call costs more
-- than the Lua around it.
local t = call('HMGET', topo, 'gen', 'rev')
local gen, rev0 = t[1], tonumber(t[2]) or 0
local rev = rev0
-- A host an operator marked down or returning takes no new claims; up and
-- disabled hosts do. The state is read only for a batch that has any (an
-- unmarked host is up).
local hostState = 'up'
if anyClaim then
  hostState = call('HGET', stateKey, 'state') or 'up'
end
local got = run('HMGET', undoKey, ids)
local missing = {}
for j = 1, #ids do
  local entry = got[j]
  if entry then
    held[ids[j]] = parse(entry, 1, #entry) or {token = '', cpus = {}, fields = {}, counts = {}}
  else
    missing[#missing + 1] = ids[j]
  end
end
-- A record without an undo entry was written before there were any.
if #missing > 0 then
  got = run('HMGET', claimsKey, missing)
  for j = 1, #missing do
    if got[j] then
      held[missing[j]] = legacy(got[j])
    end
  end
end
for _, id in ipairs(ids) do
  local u = held[id]
  if u then
    for _, cpu in ipairs(u.cpus) do
      if owners[cpu] == nil then
        owners[cpu] = false
        cpus[#cpus + 1] = cpu
      end
    end
    for _, f in ipairs(u.fields) do
      if used[f] == nil then
        used[f] = false
        fields[#fields + 1] = f
      end
    end
  end
end
if #cpus > 0 then
  got = run('HMGET', pinsKey, cpus)
  for j = 1, #cpus do
    owners[cpus[j]] = got[j]
  end
end
if #fields > 0 then
  got = run('HMGET', usageKey, fields)
  for j = 1, #fields do
    used[fields[j]] = tonumber(got[j]) or 0
  end
end

-- What changed, to write back: pCPUs, usage fields, claim ids.
local dirtyPins, dirtyUsage, dirtyClaims = {}, {}, {}
local records, entries = {}, {}
local losers = {}
local replies = {}
-- rests says a reply rests on an earlier change: see the header.
local rests = false
local leasesGone = {}

-- state reads a claim's state from its record, which starts with it.
local function state(id)
  local rec = records[id]
  if rec == nil then
    rec = call('HGET', claimsKey, id)
  end
  if not rec then
    return nil
  end
  return match(rec, '^{"state":"(%a+)"')
end

-- holds says whether a release's condition holds for claim id.
local function holds(id, cond)
  if cond == 'pending' then
    return state(id) == 'pending'
  end
  local want = match(cond, '^unchanged:(%a+)$')
  if not want or state(id) ~= want then
    return false
  end
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


for i = 1, nops do
  local p = at[i]
  local id = ARGV[p]
  local u = held[id]
  local reply
  if isclaim[i] then
    -- Check everything before changing anything: an operation that
    -- failed half way would leave half a claim behind.
    local n = tonumber(ARGV[p + 4])
    local mpos = p + 5 + n
    local last = mpos + 3 * tonumber(ARGV[mpos])
    if u then
      -- A retried claim gets the first result back.
      reply = {'exists', records[id] or call('HGET', claimsKey, id) or ''}
      rests = true
    elseif not gen then
      reply = {'nohost'}
    elseif hostState ~= 'up' and hostState ~= 'disabled' then
      reply = {'down', hostState}
    elseif gen ~= ARGV[p + 3] then
      -- The caps come from the caller's copy of the topology; they are
      -- only valid for the generation it fitted against.
      reply = {'gen', gen}
    else
      for j = p + 5, mpos - 1 do
        local owner = owners[ARGV[j]]
        if owner then
          reply = {'taken', 0, '', '', ARGV[j], owner}
          break
        end
      end
      if not reply then
        for j = mpos + 1, last, 3 do
          local cap = ARGV[j + 2]
          if cap ~= '' and used[ARGV[j]] + tonumber(ARGV[j + 1]) > tonumber(cap) then
            reply = {'full', 0, '', '', ARGV[j], tostring(used[ARGV[j]]), ARGV[j + 1], cap}
            break
          end
        end
      end
      if reply then
        losers[#losers + 1] = reply
      else
        for j = p + 5, mpos - 1 do
          local cpu = ARGV[j]
          owners[cpu] = id
          dirtyPins[cpu] = true
        end
        -- rev tells a re-registration that the claims it checked have
        -- changed, and orders the replies caches learn the host from.
        rev = rev + 1
        reply = {'ok', rev}
        for j = mpos + 1, last, 3 do
          local f = ARGV[j]
          local v = used[f] + tonumber(ARGV[j + 1])
          used[f] = v
          dirtyUsage[f] = true
          reply[#reply + 1] = v
        end
        -- Parsed only if a later operation of the batch releases it.
        held[id] = ARGV[p + 2]
        records[id], entries[id], dirtyClaims[id] = ARGV[p + 1], ARGV[p + 2], true
      end
    end
  elseif not u then
    -- Already released, or never made: releasing is idempotent.
    reply = {0}
    rests = true
  else
    if type(u) == 'string' then
      u = parse(u, 1, #u)
    end
    local token, cond = ARGV[p + 1], ARGV[p + 2]
    if token ~= '' and u.token ~= token then
      reply = {2}
      rests = true
    elseif cond ~= '' and not holds(id, cond) then
      reply = {3}
      rests = true
    else
      -- Only unpin what this claim owns: a pin is never taken from
      -- another owner, whatever the record says.
      local freed = {}
      for _, cpu in ipairs(u.cpus) do
        if owners[cpu] == id then
          owners[cpu] = false
          dirtyPins[cpu] = true
          freed[#freed + 1] = cpu
        end
      end
      -- Usage never goes below zero.
      local counters = {}
      local counts = u.counts
      for j, f in ipairs(u.fields) do
        local left = used[f] - counts[j]
        if left < 0 then
          left = 0
        end
        used[f] = left
        dirtyUsage[f] = true
        counters[2 * j - 1], counters[2 * j] = f, left
      end
      held[id], records[id], entries[id], dirtyClaims[id] = false, false, false, true
      leasesGone[#leasesGone + 1] = id
      rev = rev + 1
      reply = {1, rev, concat(freed, ','), concat(counters, ',')}
    end
  end
  replies[i] = reply
end

-- Write back what changed: at most one HSET and one HDEL per key. A usage
-- field at zero is removed, so an empty host has no usage key at all.
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
  if #set > 0 then
    run('HSET', key, set)
  end
  if #gone > 0 then
    run('HDEL', key, gone)
  end
end
write(pinsKey, dirtyPins, owners)
write(usageKey, dirtyUsage, used, true)
write(claimsKey, dirtyClaims, records)
write(undoKey, dirtyClaims, entries)
if #leasesGone > 0 then
  run('HDEL', leaseKey, leasesGone)
end
if rev ~= rev0 or (rests and gen) then
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
