-- Makes one claim on a host, whole or not at all: pins its pCPUs and PCI
-- devices, adds to its usage counters and records it with its undo entry (release.lua).
-- KEYS: topo, pins, claims, usage, undo, lease, host state, groups
--   (hostKeys.all)
-- ARGV: claim id, claim record (JSON), undo entry, the topology
--   generation the caller fitted against, n, n pins (pCPU ids, then PCI
--   device addresses), m, then m times:
--   usage field, amount to add, and the cap the field may reach or '' for
--   none; then the server group of the claim's instance ('' for none),
--   the instance's uuid, and the most members of the group the host may
--   hold ('' for no limit). The caps are every limit numa.Fit holds the counter to on that
--   generation's topology (dedicated memory, memory and shared vCPUs to
--   the allocation ratios, strict pages to the pool less its reserved
--   pages), computed by the caller once per topology; this script alone
--   judges them against the host's counters, so no view a caller fitted on
--   can place past them.
-- Returns {'ok', rev, the m fields' new values}, {'exists', record},
--   {'nohost'}, {'down', host state} (an operator fenced the host, or it
--   is returning: it takes no new claims; a disabled host takes them, as
--   only an operation that names it claims there), {'gen', current}, or
--   why it lost a race followed by the host's state, so the caller re-fits
--   without reading it again:
--   {'taken', rev, pins, usage, pin, owner} or
--   {'full', rev, pins, usage, field, used, want, cap}, where pins are the
--   pinned pCPUs and held devices and usage the counters as field,value pairs, comma-joined;
--   or {'group', members of the group on the host}: the host holds as many
--   members of the instance's anti-affinity group as the group allows, a
--   refusal no retry on this host can change.
--
-- The groups hash counts, per group, the members with a claim on the
-- host (field GROUP) and each member's claims there (GROUP|uuid), so that
-- a same-host resize, whose guest holds two claims, counts once.
--
-- A retried claim that exists writes the host's rev again, unchanged: the
-- wait for durability after the script counts only the writes of its own
-- connection, and so then covers the first try, made on whichever.
local topo, pinsKey, claimsKey, usageKey, undoKey, stateKey, groupsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8]
local call = redis.call
local id, record, entry = ARGV[1], ARGV[2], ARGV[3]

local t = call('HMGET', topo, 'gen', 'rev')
local gen, rev = t[1], tonumber(t[2]) or 0
-- A retried claim gets the first result back. A record or an undo entry
-- alone (a damaged ledger, which Verify reports) is not written over
-- either.
local existing = call('HGET', claimsKey, id)
if existing or call('HEXISTS', undoKey, id) == 1 then
  -- The reply rests on the first try: see the header.
  if gen then
    call('HSET', topo, 'rev', rev)
  end
  return {'exists', existing or ''}
end
if not gen then
  return {'nohost'}
end
local hostState = call('HGET', stateKey, 'state') or 'up'
if hostState ~= 'up' and hostState ~= 'disabled' then
  return {'down', hostState}
end
if gen ~= ARGV[4] then
  -- The caps come from the caller's copy of the topology; they are only
  -- valid for the generation it fitted against.
  return {'gen', gen}
end

local cpus, fields, adds, caps = {}, {}, {}, {}
local n = tonumber(ARGV[5])
for j = 6, 5 + n do
  cpus[#cpus + 1] = ARGV[j]
end
local m = tonumber(ARGV[6 + n])
for j = 7 + n, 6 + n + 3 * m, 3 do
  fields[#fields + 1], adds[#adds + 1], caps[#caps + 1] = ARGV[j], ARGV[j + 1], ARGV[j + 2]
end
local group, member, limit = ARGV[7 + n + 3 * m] or '', ARGV[8 + n + 3 * m], ARGV[9 + n + 3 * m]
local memberField = group .. '|' .. (member or '')

-- A lost race carries the host's state, so the caller re-fits on it; this
-- script changed nothing, so it is as of the script.
local function lost(status, ...)
  local pins = table.concat(call('HKEYS', pinsKey), ',')
  local usage = table.concat(call('HGETALL', usageKey), ',')
  return {status, rev, pins, usage, ...}
end

-- Check everything before changing anything: a claim that failed half way
-- would leave half a claim behind.
local owners = sliced('HMGET', pinsKey, cpus)
for j, cpu in ipairs(cpus) do
  if owners[j] then
    return lost('taken', cpu, owners[j])
  end
end
local got = sliced('HMGET', usageKey, fields)
local used = {}
for j, f in ipairs(fields) do
  used[f] = tonumber(got[j]) or 0
end
for j, f in ipairs(fields) do
  if caps[j] ~= '' and used[f] + tonumber(adds[j]) > tonumber(caps[j]) then
    return lost('full', f, tostring(used[f]), adds[j], caps[j])
  end
end
-- A member of the group already here (a same-host resize) is counted
-- once.
local newMember = false
if group ~= '' then
  newMember = call('HEXISTS', groupsKey, memberField) == 0
  local here = tonumber(call('HGET', groupsKey, group)) or 0
  if newMember and limit ~= '' and here >= tonumber(limit) then
    return {'group', tostring(here)}
  end
end

local pins = {}
for j, cpu in ipairs(cpus) do
  pins[2 * j - 1], pins[2 * j] = cpu, id
end
-- rev tells a re-registration that the claims it checked have changed,
-- and orders the replies caches learn the host from.
rev = rev + 1
local reply = {'ok', rev}
for j, f in ipairs(fields) do
  used[f] = used[f] + tonumber(adds[j])
  reply[#reply + 1] = used[f]
end
sliced('HSET', pinsKey, pins)
writeUsage(usageKey, used)
call('HSET', claimsKey, id, record)
call('HSET', undoKey, id, entry)
if group ~= '' then
  call('HINCRBY', groupsKey, memberField, 1)
  if newMember then
    call('HINCRBY', groupsKey, group, 1)
  end
end
call('HSET', topo, 'rev', rev)
return reply
