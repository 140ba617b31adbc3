-- Lets a member of an affinity group claim on a host: the group's host is
-- fixed by the first member to claim, and every later claim must be
-- there. refs counts the claims let through and not known to have
-- failed; a claim that failed gives its ref back (group_unbind.lua), and
-- the host is unbound again only when no claim let through may stand, so
-- two racing first members cannot both fix the host, and a first member
-- whose claim failed does not tie the group to a host it is not on.
-- KEYS: group
-- ARGV: host, the host the group may be taken from ('' for none: the
--   caller found it fenced down, and its members are being evacuated)
-- Returns {'ok', refs}, {'unknown'} or {'bound', host, refs}.
local cur = redis.call('HMGET', KEYS[1], 'policy', 'host', 'refs')
if not cur[1] then
  return {'unknown'}
end
local host, refs = cur[2] or '', tonumber(cur[3]) or 0
if host ~= '' and host ~= ARGV[1] and host ~= ARGV[2] then
  return {'bound', host, refs}
end
refs = refs + 1
redis.call('HSET', KEYS[1], 'host', ARGV[1], 'refs', refs)
return {'ok', refs}
