-- Sliding window log: give back one admitted charge, or the unspent part of a leased slice.
--
-- KEYS[1]  the limiter's log sorted set (see log.lua)
-- KEYS[2]  the log's hash beside it (fields "sum" and "seq")
-- ARGV[1]  the entry's id (log.lua's reply)
-- ARGV[2]  the entry's cost
-- ARGV[3]  optional keep: the units of the entry that stay (0 or absent: remove the entry). A
--          lease settling its slice keeps what it spent; the entry then moves back to
--          min(its time, now), since nothing of the slice is admitted after the settlement is
--          sent, so the spent units stay in the window at least as long as their hits would
--
-- Reply: the units given back (0 when the entry has already left the window).
-- Both keys keep the TTLs log.lua gave them: a settled entry only ever moves earlier.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 5 must be told to replicate effects, because TIME is read before writing. Redis 7,
  -- the first to set REDIS_VERSION_NUM, always replicates them, and would still pay a C call.
  redis.replicate_commands()
end

local log = KEYS[1]
local meta = KEYS[2]
local member = ARGV[1] .. ':' .. ARGV[2]
local cost = tonumber(ARGV[2])
local keep = tonumber(ARGV[3]) or 0
if keep > cost then
  keep = cost
end

local until_ms = tonumber(ARGV[4]) or 0
local untally = tonumber(ARGV[5]) or 0
local now = nil
local function clock()
  if now == nil then
    if ARGV[6] then
      now = tonumber(ARGV[6])
    else
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
  end
  return now
end
if until_ms > 0 and clock() > until_ms then
  return -1
end

local stamp = nil
if keep > 0 then
  stamp = tonumber(redis.call('ZSCORE', log, member))
  if stamp == nil then
    return 0
  end
end
if redis.call('ZREM', log, member) == 0 then
  return 0
end
if until_ms > 0 and untally > 0 then
  local _, tally_remove = refundable()
  tally_remove(meta, until_ms, untally)
end
if keep > 0 then
  if clock() < stamp then
    stamp = clock()
  end
  redis.call('ZADD', log, string.format('%.0f', stamp), ARGV[1] .. ':' .. string.format('%.0f', keep))
end
local back = cost - keep
local sum = tonumber(redis.call('HGET', meta, 'sum'))
if sum ~= nil and back > 0 then
  local left = sum - back
  if left < 0 then
    left = 0
  end
  redis.call('HSET', meta, 'sum', string.format('%.0f', left))
end
return back
