-- Ends the fence lease a step holds on a claim once its act has returned:
-- a step that acts no more holds nothing back (another operation's Take,
-- the audit's compare-and-delete). A lease of another token is left.
-- KEYS: lease
-- ARGV: claim id, token
-- Returns 1 when a lease ended, 0 when there was none of the token.
local lease = redis.call('HGET', KEYS[1], ARGV[1])
if lease and string.sub(lease, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
