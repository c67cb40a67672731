-- The refundable tally: what a shared store knows of the charges that may still be given back.
-- Prepended to counter.lua, log.lua and their refunds (one script text each), so that all four
-- keep one definition of it.
--
-- A tentative charge (a hit of a request with other limits, which the limiter gives back when
-- another limit refuses; a leased slice, whose unspent units are given back when it settles)
-- carries a horizon: it may be given back until F, the store's time of the charge plus the
-- horizon, and a refund that arrives after F is refused, so the charge stands. Until F its units
-- are tallied in the hash `tally` beside the window:
--   field "r<s>"  units whose horizon ends in second s = floor(F / 1000)
--   field "rf"    the latest F tallied (so a window with nothing refundable costs one HGET)
-- A refusal reads the tally to say how long it stands *certainly*, whatever is given back: every
-- unit in a field whose second has not ended counts as refundable, which overcounts (never
-- undercounts) what may still come back.
--
-- Invariants: a field's units are at least what its charges could still give back (a refund
-- removes what it gives back or makes final, never more); fields of ended seconds mean nothing
-- and are swept once the hash holds more than TALLY_FIELDS fields; every value is an integer
-- below 2^53.

local TALLY_FIELDS = 12 -- the hash's size above which ended seconds are swept on a write

-- Every definition here is made on every call of the script it heads, its hot path included,
-- so there are three (each a closure Redis allocates), and they format with '%.0f' rather than
-- finding the width of a C long first: they run only for tentative charges and refusals.

-- Tallies `units` refundable until `until_ms`; sweeps the fields of ended seconds when the
-- hash has grown.
local function tally_add(tally, until_ms, units, now)
  local field = 'r' .. string.format('%.0f', math.floor(until_ms / 1000))
  redis.call('HINCRBY', tally, field, string.format('%.0f', units))
  local latest = tonumber(redis.call('HGET', tally, 'rf'))
  if latest == nil or latest < until_ms then
    redis.call('HSET', tally, 'rf', string.format('%.0f', until_ms))
  end
  if redis.call('HLEN', tally) > TALLY_FIELDS then
    local second = math.floor(now / 1000)
    for _, name in ipairs(redis.call('HKEYS', tally)) do
      if string.byte(name, 1) == 114 then -- 'r'
        local s = tonumber(string.sub(name, 2))
        if s and s < second then
          redis.call('HDEL', tally, name)
        end
      end
    end
  end
end

-- Removes `units` refundable until `until_ms` from the tally (given back, or made final).
local function tally_remove(tally, until_ms, units)
  local field = 'r' .. string.format('%.0f', math.floor(until_ms / 1000))
  local left = tonumber(redis.call('HGET', tally, field))
  if left == nil then
    return
  end
  if left <= units then
    redis.call('HDEL', tally, field)
  else
    redis.call('HSET', tally, field, string.format('%.0f', left - units))
  end
end

-- The units that may still be given back at `now`.
local function tally_units(tally, now)
  local latest = tonumber(redis.call('HGET', tally, 'rf'))
  if latest == nil or latest < now then
    return 0
  end
  local second = math.floor(now / 1000)
  local fields = redis.call('HGETALL', tally)
  local units = 0
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.byte(name, 1) == 114 then -- 'r'
      local s = tonumber(string.sub(name, 2))
      if s and s >= second then
        units = units + (tonumber(fields[i + 1]) or 0)
      end
    end
  end
  return units
end

