-- Commits a re-pin: the resident claim takes the re-pin claim's target
-- placement, in one step. The pCPUs the resident held and the target
-- does not are freed, those the re-pin claim held are handed over, the
-- resident's record and the pins of its undo entry are rewritten (its
-- token, counters and group stay: a re-pin moves no memory and no
-- device), and the re-pin claim is gone.
-- KEYS: topo, pins, claims, usage, undo, lease, host state, groups
--   (hostKeys.all)
-- ARGV: resident claim id, re-pin claim id, the resident's new record,
--   the new pins of its undo entry (pCPUs then devices, comma-joined),
--   n, n pCPUs to free, m, m pCPUs to hand over
-- Returns {'ok', rev}; {'done'} when the resident's record already names
-- the re-pin as its last (a retry); {'unknown', which} when the re-pin
-- or the resident claim is not there; {'state', which, state} when the
-- re-pin is not pending or the resident not committed; {'owner', pCPU,
-- owner} when a pCPU to free or hand over is not the claim's it should be.
local pinsKey, claimsKey, undoKey, topo = KEYS[2], KEYS[3], KEYS[5], KEYS[1]
local call = redis.call
local resident, repin, record, newPins = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local was = call('HGET', claimsKey, resident)
local rec = call('HGET', claimsKey, repin)
if not rec then
  if was and string.find(was, '"repin":"' .. repin .. '"', 1, true) then
    return {'done'}
  end
  return {'unknown', 'repin'}
end
if not was then
  return {'unknown', 'resident'}
end
-- Records are written with "state" as their first member (claim_state.lua).
local st = string.match(rec, '^{"state":"(%a+)",')
if st ~= 'pending' then
  return {'state', 'repin', st or ''}
end
st = string.match(was, '^{"state":"(%a+)",')
if st ~= 'committed' then
  return {'state', 'resident', st or ''}
end

local n = tonumber(ARGV[5])
local free, over = {}, {}
for j = 6, 5 + n do
  free[#free + 1] = ARGV[j]
end
local m = tonumber(ARGV[6 + n])
for j = 7 + n, 6 + n + m do
  over[#over + 1] = ARGV[j]
end
-- Check everything before changing anything.
local owners = sliced('HMGET', pinsKey, free)
for j, cpu in ipairs(free) do
  if owners[j] ~= resident then
    return {'owner', cpu, owners[j] or ''}
  end
end
owners = sliced('HMGET', pinsKey, over)
for j, cpu in ipairs(over) do
  if owners[j] ~= repin then
    return {'owner', cpu, owners[j] or ''}
  end
end
local entry = call('HGET', undoKey, resident)
local token, rest = string.match(entry or '', '^([^|]*)|[^|]*(|.*)$')
if not token then
  return {'unknown', 'undo'}
end

if #free > 0 then
  sliced('HDEL', pinsKey, free)
end
local pins = {}
for j, cpu in ipairs(over) do
  pins[2 * j - 1], pins[2 * j] = cpu, resident
end
if #pins > 0 then
  sliced('HSET', pinsKey, pins)
end
call('HSET', claimsKey, resident, record)
call('HSET', undoKey, resident, token .. '|' .. newPins .. rest)
call('HDEL', claimsKey, repin)
call('HDEL', undoKey, repin)
local rev = (tonumber(call('HGET', topo, 'rev')) or 0) + 1
call('HSET', topo, 'rev', rev)
return {'ok', rev}
