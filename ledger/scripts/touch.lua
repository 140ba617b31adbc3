-- Writes one hash field again, unchanged, if it is set. A wait for
-- durability counts the writes of its own connection up to its last one,
-- and the server's replication stream is in order: after this script a
-- wait covers every change the slot had before it, such as the claim a
-- retried Claim found made already, by whichever connection.
-- KEYS: the hash
-- ARGV: the field
-- Returns 1 when the field was set, else 0.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], v)
return 1
