-- Hands a pending claim to another owner, in place: its record is replaced
-- only if it is still exactly the one the caller read, and the token in
-- its undo entry changes with the record's. Pins, usage and the rest of
-- the undo entry stay, so the pCPUs change hands without ever being free.
-- KEYS: claims, undo
-- ARGV: claim id, the record read, the new record, the old token, the new
-- token
-- Returns {'ok'}, {'unknown'} or {'changed'} (the record is not the one
-- read: retry on what is there now).
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return {'unknown'}
end
if record ~= ARGV[2] then
  return {'changed'}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local entry = redis.call('HGET', KEYS[2], ARGV[1])
local prefix = ARGV[4] .. '|'
if entry and string.sub(entry, 1, #prefix) == prefix then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[5] .. '|' .. string.sub(entry, #prefix + 1))
end
return {'ok'}
