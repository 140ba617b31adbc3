-- Shared by claim.lua, release.lua and repin_commit.lua, which loadScript
-- prefixes with it.

-- Lua's unpack stops short of 8,000 values, and numa admits guests of up
-- to 8,192 pinned vCPUs: a long list goes to Redis in slices, of an even
-- length so that no field is parted from its value. An empty list sends
-- nothing.
local function sliced(cmd, key, list)
  local out = {}
  for i = 1, #list, 1000 do
    local got = redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
    if type(got) == 'table' then
      for _, v in ipairs(got) do
        out[#out + 1] = v
      end
    end
  end
  return out
end

-- writeUsage stores the counters of used, field to value; a counter at
-- zero is removed, so an empty host has no usage key at all.
local function writeUsage(usageKey, used)
  local set, gone = {}, {}
  for f, v in pairs(used) do
    if v > 0 then
      set[#set + 1] = f
      set[#set + 1] = v
    else
      gone[#gone + 1] = f
    end
  end
  sliced('HSET', usageKey, set)
  sliced('HDEL', usageKey, gone)
end
