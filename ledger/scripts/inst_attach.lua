-- Points an instance at a host and the committed claim that holds its
-- resources there, and for a resize or cold migration changes its request
-- and resize info in the same step. The caller has checked the claim
-- first: the claim lives in another slot, so this script cannot.
-- KEYS: instance
-- ARGV: host, node, placement JSON, claim id, domain XML, domain XML mode
-- ('keep', 'set' to the XML given, or 'staged': the XML staged for the
-- claim, inst_stage.lua), updated_at, digest of the domain XML, request
-- JSON ('' keeps the request), resize mode ('keep', 'set' or 'clear'),
-- resize JSON (for 'set')
-- Returns {'ok'}, {'same'} or {'unknown'}.
-- A move that takes the staged XML but finds none staged for its claim
-- (Redis lost it, or a stray attempt of an earlier operation staged over
-- it) removes the record's domain XML: that was made for another
-- placement and would pin the guest, defined again from it, on CPUs it
-- does not hold; the next move reads a missing XML from the hypervisor,
-- or builds it from the flavor.
-- A retry that finds the change made already writes one field again,
-- unchanged: a wait for durability after the script counts only its own
-- connection's writes, and so then covers the change another connection
-- made.
local cur = redis.call('HMGET', KEYS[1], 'uuid', 'host', 'claim_id', 'domain_xml', 'request', 'resize', 'staged_claim_id')
if not cur[1] then
  return {'unknown'}
end
local xmlMode, xml, digest = ARGV[6], ARGV[5], ARGV[8]
local attached = cur[2] == ARGV[1] and cur[3] == ARGV[4]
if xmlMode == 'staged' then
  if cur[7] == ARGV[4] then
    local staged = redis.call('HMGET', KEYS[1], 'staged_xml', 'staged_digest')
    if staged[1] then
      xmlMode, xml, digest = 'set', staged[1], staged[2] or ''
    else
      xmlMode = 'clear'
    end
    redis.call('HDEL', KEYS[1], 'staged_claim_id', 'staged_xml', 'staged_digest')
  elseif attached then
    -- The try that attached took the staged XML already.
    xmlMode = 'keep'
  else
    xmlMode = 'clear'
  end
end
local xmlSame = xmlMode == 'keep' or (xmlMode == 'set' and cur[4] == xml) or (xmlMode == 'clear' and not cur[4])
local mode = ARGV[10]
local resizeSame = mode == 'keep' or (mode == 'set' and cur[6] == ARGV[11]) or (mode == 'clear' and (cur[6] or '') == '')
if attached and xmlSame and (ARGV[9] == '' or cur[5] == ARGV[9]) and resizeSame then
  redis.call('HSET', KEYS[1], 'host', cur[2])
  return {'same'}
end
redis.call('HSET', KEYS[1], 'host', ARGV[1], 'node', ARGV[2], 'placement', ARGV[3],
  'claim_id', ARGV[4], 'updated_at', ARGV[7])
if xmlMode == 'set' then
  redis.call('HSET', KEYS[1], 'domain_xml', xml, 'domain_digest', digest)
elseif xmlMode == 'clear' then
  redis.call('HDEL', KEYS[1], 'domain_xml', 'domain_digest')
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
