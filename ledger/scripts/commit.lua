-- Marks a pending claim committed; committing a committed claim changes
-- nothing, but writes the record again: a wait for durability after this
-- script counts only its own connection's writes, and so then covers the
-- commit that another connection made.
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
end
redis.call('HSET', KEYS[1], ARGV[1], record)
return {'ok', record}
