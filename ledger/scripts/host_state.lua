-- Records what an operator said of a host: down (fenced: it takes no
-- claims and its guests may be evacuated), returning (its tombstones are
-- being cleared) or up (the default). Only these moves exist: any state to
-- down, down to returning, and returning to up while the host holds no
-- tombstone.
-- KEYS: topo, host state, claims
-- ARGV: target state, reason and token (written when the host goes down),
-- since (a timestamp)
-- Returns {'ok', state, reason, token, since}, {'nohost'},
-- {'conflict', current state} or {'tombstones', how many}.
-- A host in the target state already changes nothing (a host down keeps
-- the reason and token of its first fencing), but one key is written
-- again, unchanged: a wait for durability after this script counts only
-- its own connection's writes, and so then covers the change another
-- connection made.
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then
  return {'nohost'}
end
local cur = redis.call('HMGET', KEYS[2], 'state', 'reason', 'token', 'since')
local state, to = cur[1] or 'up', ARGV[1]
if state == to then
  if cur[1] then
    redis.call('HSET', KEYS[2], 'state', state)
  else
    -- Never marked: write the generation again rather than make a key.
    redis.call('HSET', KEYS[1], 'gen', gen)
  end
  return {'ok', state, cur[2] or '', cur[3] or '', cur[4] or ''}
end
if to == 'down' then
  redis.call('HSET', KEYS[2], 'state', 'down', 'reason', ARGV[2], 'token', ARGV[3], 'since', ARGV[4])
  return {'ok', 'down', ARGV[2], ARGV[3], ARGV[4]}
end
if to == 'returning' then
  if state ~= 'down' then
    return {'conflict', state}
  end
  redis.call('HSET', KEYS[2], 'state', 'returning', 'since', ARGV[4])
  return {'ok', 'returning', cur[2] or '', cur[3] or '', ARGV[4]}
end
if to ~= 'up' or state ~= 'returning' then
  return {'conflict', state}
end
-- A tombstone's pCPUs may still run the guest left behind: the host takes
-- claims again only once every one is released.
local n = 0
local prefix = '{"state":"tombstone",'
for _, rec in ipairs(redis.call('HVALS', KEYS[3])) do
  if string.sub(rec, 1, #prefix) == prefix then
    n = n + 1
  end
end
if n > 0 then
  return {'tombstones', n}
end
redis.call('HSET', KEYS[2], 'state', 'up', 'since', ARGV[4])
redis.call('HDEL', KEYS[2], 'reason', 'token')
return {'ok', 'up', '', '', ARGV[4]}
