-- Renews the fence lease of a claim for a hypervisor step that acts for
-- it, if the claim still exists with the caller's token. While the lease
-- runs, the audit's compare-and-delete refuses to free the claim, so a
-- step that passed its fence cannot be overtaken by a release. A host
-- an operator marked down or returning is refused like a gone claim: no
-- guest starts there, nor switches over to it, until it is up; a step
-- that only tears a guest down (ARGV[4] 'teardown') may act there.
-- KEYS: undo, lease, host state
-- ARGV: claim id, token, lease length in milliseconds, 'teardown' or ''
-- Returns {'ok', lease end in ms of the server's clock}, {'gone'},
-- {'token'} (the claim was made again by someone else) or {'down', host
-- state}.
-- The claim's token is read from its undo entry, "token|...", which the
-- claim script writes with its record and the release deletes with it.
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then
  return {'gone'}
end
if string.match(entry, '^([^|]*)|') ~= ARGV[2] then
  return {'token'}
end
local host = redis.call('HGET', KEYS[3], 'state') or 'up'
if ARGV[4] ~= 'teardown' and (host == 'down' or host == 'returning') then
  return {'down', host}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. '|' .. until_ms)
return {'ok', until_ms}
