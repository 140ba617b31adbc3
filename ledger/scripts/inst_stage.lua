-- Keeps the domain XML an operation made for one of the instance's claims
-- in its record, until the move that attaches the record to that claim
-- makes it the record's domain XML (inst_attach.lua): the document stays
-- out of workflow history. An instance has one staged document; operations
-- on it run one at a time, and a new one replaces the last.
-- KEYS: instance
-- ARGV: claim id, domain XML, digest of the XML
-- Returns 1, or 0 when there is no such instance.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'staged_claim_id', ARGV[1], 'staged_xml', ARGV[2], 'staged_digest', ARGV[3])
return 1
