-- Records what an operator said of a host: down (fenced: it takes no
-- claims and its guests may be evacuated), returning (its tombstones are
-- being cleared), disabled (its guests stay, and it takes only the claims
-- that name it) or up (the default). Only these moves exist: any state to
-- down, down to returning, returning to up while the host holds no
-- tombstone, and up to disabled and back ('enabled'). A down or returning
-- host is neither disabled nor enabled: it must come up first.
-- KEYS: topo, host state, claims
-- ARGV: target state, or 'enabled' (disabled to up); reason (written when
-- the host goes down or disabled); token (written when it goes down);
-- since (a timestamp)
-- A host leaving down drops its automatic evacuation (host_evacuate.lua).
-- Returns {'ok', state, reason, token, since, evacuate}, {'nohost'},
-- {'conflict', current state} or {'tombstones', how many}.
-- A host in the target state already changes nothing (a host down keeps
-- the reason and token of its first fencing; a host disabled takes the
-- new reason but keeps the time it was first disabled), but one key is
-- written again, unchanged: a wait for durability after this script
-- counts only its own connection's writes, and so then covers the change
-- another connection made.
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then
  return {'nohost'}
end
local cur = redis.call('HMGET', KEYS[2], 'state', 'reason', 'token', 'since', 'evacuate')
local state, to = cur[1] or 'up', ARGV[1]
if to == 'disabled' or to == 'enabled' then
  if state ~= 'up' and state ~= 'disabled' then
    return {'conflict', state}
  end
  if to == 'disabled' then
    if state == 'disabled' then
      redis.call('HSET', KEYS[2], 'reason', ARGV[2])
      return {'ok', 'disabled', ARGV[2], cur[3] or '', cur[4] or '', ''}
    end
    redis.call('HSET', KEYS[2], 'state', 'disabled', 'reason', ARGV[2], 'since', ARGV[4])
    return {'ok', 'disabled', ARGV[2], cur[3] or '', ARGV[4], ''}
  end
  if state == 'disabled' then
    redis.call('HSET', KEYS[2], 'state', 'up', 'since', ARGV[4])
    redis.call('HDEL', KEYS[2], 'reason', 'token')
    return {'ok', 'up', '', '', ARGV[4], ''}
  end
  -- Enabling a host that is up is a retry, as below.
  to = 'up'
end
if state == to then
  if cur[1] then
    redis.call('HSET', KEYS[2], 'state', state)
  else
    -- Never marked: write the generation again rather than make a key.
    redis.call('HSET', KEYS[1], 'gen', gen)
  end
  return {'ok', state, cur[2] or '', cur[3] or '', cur[4] or '', cur[5] or ''}
end
if to == 'down' then
  redis.call('HSET', KEYS[2], 'state', 'down', 'reason', ARGV[2], 'token', ARGV[3], 'since', ARGV[4])
  redis.call('HDEL', KEYS[2], 'evacuate')
  return {'ok', 'down', ARGV[2], ARGV[3], ARGV[4], ''}
end
if to == 'returning' then
  if state ~= 'down' then
    return {'conflict', state}
  end
  redis.call('HSET', KEYS[2], 'state', 'returning', 'since', ARGV[4])
  redis.call('HDEL', KEYS[2], 'evacuate')
  return {'ok', 'returning', cur[2] or '', cur[3] or '', ARGV[4], ''}
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
redis.call('HDEL', KEYS[2], 'reason', 'token', 'evacuate')
return {'ok', 'up', '', '', ARGV[4], ''}
