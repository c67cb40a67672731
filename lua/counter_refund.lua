-- Sliding window counter: give back one admitted charge.
--
-- KEYS[1]  the limiter's counter hash (see counter.lua)
-- ARGV[1]  k: the fixed window the charge was added to (counter.lua's reply)
-- ARGV[2]  cost: the units that charge consumed
--
-- Reply: the units actually given back (0 when window k is gone; the count never goes below 0).
-- The key keeps the TTL counter.lua gave it; an emptied window's field is deleted.

local key = KEYS[1]
local field = ARGV[1]
local cost = tonumber(ARGV[2])

local count = tonumber(redis.call('HGET', key, field))
if count == nil or count <= 0 then
  return 0
end
if count <= cost then
  redis.call('HDEL', key, field)
  return count
end
redis.call('HSET', key, field, string.format('%.0f', count - cost))
return cost
