-- Points an instance at a host and the committed claim that holds its
-- resources there, and for a resize or cold migration changes its request
-- and resize info in the same step. The caller has checked the claim
-- first: the claim lives in another slot, so this script cannot.
-- KEYS: instance
-- ARGV: host, node, placement JSON, claim id, domain XML, set domain XML
-- (0/1), updated_at, digest of the domain XML, request JSON ('' keeps
-- the request), resize mode ('keep', 'set' or 'clear'), resize JSON (for
-- 'set')
-- Returns {'ok'}, {'same'} or {'unknown'}.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'host', 'claim_id', 'domain_xml', 'request', 'resize')
if not cur[1] then
  return {'unknown'}
end
local mode = ARGV[10]
local resizeSame = mode == 'keep' or (mode == 'set' and cur[6] == ARGV[11]) or (mode == 'clear' and (cur[6] or '') == '')
if cur[2] == ARGV[1] and cur[3] == ARGV[4] and (ARGV[6] == '0' or cur[4] == ARGV[5]) and
    (ARGV[9] == '' or cur[5] == ARGV[9]) and resizeSame then
  redis.call('HSET', KEYS[1], 'host', cur[2])
  return {'same'}
end
redis.call('HSET', KEYS[1], 'host', ARGV[1], 'node', ARGV[2], 'placement', ARGV[3],
  'claim_id', ARGV[4], 'updated_at', ARGV[7])
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'domain_xml', ARGV[5], 'domain_digest', ARGV[8])
end
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[1], 'request', ARGV[9])
end
if mode == 'set' then
  redis.call('HSET', KEYS[1], 'resize', ARGV[11])
elseif mode == 'clear' then
  redis.call('HDEL', KEYS[1], 'resize')
end
return {'ok'}
