-- Sliding window log: give back one admitted charge by removing its entry.
--
-- KEYS[1]  the limiter's log sorted set (see log.lua)
-- KEYS[2]  the log's hash beside it (fields "sum" and "seq")
-- ARGV[1]  the entry's id (log.lua's reply)
-- ARGV[2]  the entry's cost
--
-- Reply: the units given back (0 when the entry has already left the window).
-- Both keys keep the TTLs log.lua gave them.

local log = KEYS[1]
local meta = KEYS[2]
local cost = tonumber(ARGV[2])

if redis.call('ZREM', log, ARGV[1] .. ':' .. ARGV[2]) == 0 then
  return 0
end
local sum = tonumber(redis.call('HGET', meta, 'sum'))
if sum ~= nil then
  local left = sum - cost
  if left < 0 then
    left = 0
  end
  redis.call('HSET', meta, 'sum', string.format('%.0f', left))
end
return cost
