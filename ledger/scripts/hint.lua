-- Notes that hosts' usage or topology changed, for the placement indexes
-- of every process, which read the hosts changed since their last look
-- instead of every host.
-- KEYS: the changed set
-- ARGV: how long an entry is kept (µs), then the host names
-- Each host's score becomes the server's time in µs, or one more than the
-- highest score in the set if that is not below it: scores only grow, so
-- an index that has read up to a score misses no later change, whatever
-- the clock does. Entries older than the retention go.
-- Returns the score.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= now then
  now = tonumber(top[2]) + 1
end
-- %.0f: tostring would print 1.7e+15, losing the µs.
local score = string.format('%.0f', now)
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = score
  args[#args + 1] = ARGV[i]
end
redis.call('ZADD', KEYS[1], unpack(args))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now - tonumber(ARGV[1])))
return score
