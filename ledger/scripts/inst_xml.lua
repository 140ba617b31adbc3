-- Sets an existing instance's domain XML.
-- KEYS: instance
-- ARGV: domain XML, updated_at, digest of the XML
-- Returns 1, or 0 when there is no such instance.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'domain_xml', ARGV[1], 'updated_at', ARGV[2], 'domain_digest', ARGV[3])
return 1
