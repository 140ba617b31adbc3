-- Points an instance at a host and the committed claim that holds its
-- resources there. The caller has checked the claim first: the claim lives
-- in another slot, so this script cannot.
-- KEYS: instance
-- ARGV: host, node, placement JSON, claim id, domain XML, set domain XML
-- (0/1), updated_at, digest of the domain XML
-- Returns {'ok'}, {'same'} or {'unknown'}.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'host', 'claim_id', 'domain_xml')
if not cur[1] then
  return {'unknown'}
end
if cur[2] == ARGV[1] and cur[3] == ARGV[4] and (ARGV[6] == '0' or cur[4] == ARGV[5]) then
  redis.call('HSET', KEYS[1], 'host', cur[2])
  return {'same'}
end
redis.call('HSET', KEYS[1], 'host', ARGV[1], 'node', ARGV[2], 'placement', ARGV[3],
  'claim_id', ARGV[4], 'updated_at', ARGV[7])
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'domain_xml', ARGV[5], 'domain_digest', ARGV[8])
end
return {'ok'}
