-- Takes a removed host's name off the registry of host names. A name gone
-- already is added and removed again in one step nobody sees half done: a
-- wait for durability after this script then covers the first removal,
-- whichever connection made it.
-- KEYS: hosts
-- ARGV: host name
-- Returns 1.
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then
  redis.call('SADD', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[1], ARGV[1])
end
return 1
