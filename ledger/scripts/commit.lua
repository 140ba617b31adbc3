-- Marks a pending claim committed; committing a committed claim changes
-- nothing.
-- KEYS: claims
-- ARGV: claim id, commit time as a JSON string
-- Returns {'ok', record} or {'unknown'}.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return {'unknown'}
end
-- Records are written with "state" as their first member, so the state is
-- changed by replacing that fixed prefix: no JSON round trip in Lua, which
-- would turn empty arrays into objects.
local pending = '{"state":"pending",'
if string.sub(record, 1, #pending) == pending then
  record = '{"state":"committed","committed_at":' .. ARGV[2] .. ',' .. string.sub(record, #pending + 1)
  redis.call('HSET', KEYS[1], ARGV[1], record)
end
return {'ok', record}
