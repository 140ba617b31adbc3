-- Gives a claim a new token if it has one of the tokens the caller knows
-- it by (compare-and-set): an operation takes its guest's claim from the
-- token it read when it began, and a compensation from its operation's
-- own. Every step that fences with the old token is refused from then on.
-- A fence lease another token holds still runs: the step that holds it
-- may act until it ends, so the claim is not taken before then.
-- KEYS: claims, undo, lease
-- ARGV: claim id, new token, the tokens it may be taken from ('|'-joined;
-- '' takes it from any)
-- Returns {'ok'}, {'gone'}, {'token'} (it has a token not among them) or
-- {'leased', lease end in ms of the server's clock}.
-- The token lives in the undo entry ("token|...") and in the claim's
-- record ("token":"..."); both change together. Taking a claim that has
-- the token already changes nothing, but writes the record again: a wait
-- for durability counts only its own connection's writes.
local id, token = ARGV[1], ARGV[2]
local entry = redis.call('HGET', KEYS[2], id)
local record = redis.call('HGET', KEYS[1], id)
if not entry or not record then
  return {'gone'}
end
local old = string.match(entry, '^([^|]*)|')
if ARGV[3] ~= '' and old ~= token then
  local known = false
  for t in string.gmatch(ARGV[3], '[^|]+') do
    if t == old then
      known = true
    end
  end
  if not known then
    return {'token'}
  end
end
local lease = redis.call('HGET', KEYS[3], id)
if lease and old ~= token then
  local holder, until_ms = string.match(lease, '^([^|]*)|(%d+)$')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if holder ~= token and tonumber(until_ms) > now then
    return {'leased', tonumber(until_ms)}
  end
end
local needle = '"token":"' .. old .. '"'
local at = string.find(record, needle, 1, true)
if at then
  record = string.sub(record, 1, at - 1) .. '"token":"' .. token .. '"' .. string.sub(record, at + #needle)
end
redis.call('HSET', KEYS[1], id, record)
redis.call('HSET', KEYS[2], id, token .. string.sub(entry, #old + 1))
if old ~= token then
  redis.call('HDEL', KEYS[3], id)
end
return {'ok'}
