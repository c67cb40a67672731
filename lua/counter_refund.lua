-- Sliding window counter: give back one admitted charge, or the unspent part of a leased slice.
--
-- KEYS[1]  the limiter's counter hash (see counter.lua)
-- ARGV[1]  k: the fixed window the charge was added to (counter.lua's reply)
-- ARGV[2]  the units to give back (a settled slice keeps what it spent: 0 when it spent all)
-- ARGV[3]  optional F: the end of the charge's refund horizon (the decision time plus the H
--          counter.lua was given), 0 or absent for a charge decided without one
-- ARGV[4]  optional units the refund takes off the refundable tally (refundable.lua): what it
--          gives back plus what it keeps for good; 0 or absent when F is
-- ARGV[5]  optional time in ms since the epoch, for tests (ARGV[3] and ARGV[4] then present);
--          without it the server's clock (TIME) tells
--
-- Reply: the units actually given back (0 when window k is gone; the count never goes below 0),
-- or -1 when F has passed: nothing changes, the charge stands (an instance may have cached a
-- refusal that holds only while it does).
-- The key keeps the TTL counter.lua gave it; an emptied window's field is deleted.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 5 must be told to replicate effects, because TIME is read before writing.
  redis.replicate_commands()
end

local key = KEYS[1]
local field = ARGV[1]
local cost = tonumber(ARGV[2])
local until_ms = tonumber(ARGV[3]) or 0
local untally = tonumber(ARGV[4]) or 0

if until_ms > 0 then
  local now
  if ARGV[5] then
    now = tonumber(ARGV[5])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if now > until_ms then
    return -1
  end
  if untally > 0 then
    local _, tally_remove = refundable()
    tally_remove(key, until_ms, untally)
  end
end

if cost <= 0 then
  return 0
end
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
