-- Binds the ledger to the Temporal deployment it serves, unless it is
-- bound already: the first caller binds, and every caller learns which
-- deployment the ledger serves. A binding made by namespace name alone
-- takes the namespace id of the first caller of that name that knows it.
-- KEYS: the deployment key
-- ARGV: the deployment to bind to (JSON: namespace, namespace_id)
-- Returns the deployment the ledger serves.
local bound = redis.call('GET', KEYS[1])
if not bound then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
local have, want = cjson.decode(bound), cjson.decode(ARGV[1])
if have.namespace == want.namespace and (have.namespace_id == nil or have.namespace_id == '') and
    want.namespace_id ~= nil and want.namespace_id ~= '' then
  have.namespace_id = want.namespace_id
  bound = cjson.encode({namespace = have.namespace, namespace_id = have.namespace_id})
  redis.call('SET', KEYS[1], bound)
end
return bound
