-- Releases one claim on a host: unpins its pCPUs and devices, takes its
-- usage off the counters and deletes its record, undo entry and fence
-- lease.
-- KEYS: topo, pins, claims, usage, undo, lease, host state, groups
--   (hostKeys.all)
-- ARGV: claim id, token ('' releases whatever the token), condition:
--   '' none; 'pending' only a pending claim (a compensation must never
--   free a claim that became resident); or 'unchanged:STATE' only a claim
--   in STATE whose fence lease has run out (the audit decided on the claim
--   as it was, and a fenced hypervisor step may be acting for it right
--   now)
-- Returns {'released', rev, freed pins, changed counters} (comma-joined,
--   the counters as field,value pairs), {'absent'} when there is no such
--   claim, {'token'} when its token did not match, {'unmet'} when the
--   condition did not hold, or {'no-undo'} when the claim's record has no
--   undo entry (nothing released).
--
-- A reply of absent, token or unmet rests on an earlier change (the release already
-- made, the claim made again or changed) and writes the host's rev again,
-- unchanged: the wait for durability after the script counts only the
-- writes of its own connection, and so then covers that change, made on
-- whichever.
--
-- The undo hash holds, beside each claim record, what the claim took:
-- "token|pins|field,n,field,n", and for a member of a server group
-- "|group|uuid" after them (claim.lua counts it; undoEntry in undo.go
-- states the format once). A release reads that short entry instead
-- of the record: every string that enters Lua is hashed byte by byte, and
-- a record is a hundred times longer.
local topo, pinsKey, claimsKey, usageKey, undoKey, leaseKey, groupsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8]
local call = redis.call
local find, sub, match, gmatch = string.find, string.sub, string.match, string.gmatch
local id, token, cond = ARGV[1], ARGV[2], ARGV[3]

-- parse reads an undo entry, "token|pins|field,n,...[|group|uuid]", into
-- {token, cpus, fields, counts, member}, the pins being pCPU ids and PCI
-- device addresses alike and member "group|uuid" or nil; nil if it is
-- not one.
local function parse(entry)
  local bar1 = find(entry, '|', 1, true)
  local bar2 = bar1 and find(entry, '|', bar1 + 1, true)
  if not bar2 then
    return nil
  end
  local u = {token = sub(entry, 1, bar1 - 1), cpus = {}, fields = {}, counts = {}}
  for cpu in gmatch(sub(entry, bar1 + 1, bar2 - 1), '[^,]+') do
    u.cpus[#u.cpus + 1] = cpu
  end
  local counters = sub(entry, bar2 + 1)
  local bar3 = find(entry, '|', bar2 + 1, true)
  if bar3 then
    counters = sub(entry, bar2 + 1, bar3 - 1)
    u.member = sub(entry, bar3 + 1)
  end
  for f, n in gmatch(counters, '([^,]+),(%d+)') do
    u.fields[#u.fields + 1] = f
    u.counts[#u.counts + 1] = tonumber(n)
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

local entry = call('HGET', undoKey, id)
if not entry then
  if call('HEXISTS', claimsKey, id) == 1 then
    -- A record without its undo entry (a damaged ledger, which Verify
    -- reports): what the claim took is unknown, so nothing is freed.
    return {'no-undo'}
  end
  -- Already released, or never made: releasing is idempotent.
  return rest({'absent'})
end
local u = parse(entry) or {token = '', cpus = {}, fields = {}, counts = {}}
if token ~= '' and u.token ~= token then
  return rest({'token'})
end
if cond ~= '' and not holds() then
  return rest({'unmet'})
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
if u.member then
  -- The member's last claim here takes it off the group's count.
  if call('HINCRBY', groupsKey, u.member, -1) <= 0 then
    call('HDEL', groupsKey, u.member)
    local group = match(u.member, '^([^|]*)|')
    if call('HINCRBY', groupsKey, group, -1) <= 0 then
      call('HDEL', groupsKey, group)
    end
  end
end
rev = rev + 1
call('HSET', topo, 'rev', rev)
return {'released', rev, table.concat(freed, ','), table.concat(counters, ',')}
