-- Adds a host to the registry of host names. A host listed already is
-- written again, removed and added in one step that nobody sees half
-- done: a wait for durability after this script then covers the first
-- add too, whichever connection made it (a wait counts only the writes
-- of its own connection, up to its last one).
-- KEYS: hosts
-- ARGV: host name
-- Returns 1.
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then
  redis.call('SREM', KEYS[1], ARGV[1])
  redis.call('SADD', KEYS[1], ARGV[1])
end
return 1
