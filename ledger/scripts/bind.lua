-- Binds the ledger to the Temporal deployment it serves, unless it is
-- bound already: the first caller binds, and every caller learns which
-- deployment the ledger serves.
-- KEYS: the deployment key
-- ARGV: the deployment to bind to (JSON)
-- Returns the deployment the ledger serves.
local bound = redis.call('GET', KEYS[1])
if bound then
  return bound
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
