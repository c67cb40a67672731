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
-- A refusal reads the tally to say how long it stands *certainly*, whatever is given back: every
-- unit in a field whose second has not ended counts as refundable, which overcounts (never
-- undercounts) what may still come back.
--
-- Invariants: a field's units are at least what its charges could still give back (a refund
-- removes what it gives back or makes final, never more); fields of ended seconds mean nothing
-- and are swept when a new field makes the hash hold more than TALLY_FIELDS fields (a new field
-- comes at most once a second, so the sweep's HLEN is not paid by every charge); every value is
-- an integer below 2^53.
--
-- A tentative charge pays one HINCRBY for all this (measured with redis-cpu: every command more
-- here is paid by every limit of every request of several limits).

-- The script this heads makes one closure of it on every call, its hot path included; the
-- tally's three functions are made only by a call that needs them (`local add, remove, units =
-- refundable()`), since each closure is an allocation Redis makes. They format with '%.0f'
-- rather than finding the width of a C long first: they run only for tentative charges,
-- refunds and refusals.
local function refundable()
  local TALLY_FIELDS = 12 -- the hash's size above which ended seconds are swept on a write

  -- Tallies `units` refundable until `until_ms`; sweeps the fields of ended seconds when a new
  -- field has grown the hash.
  local function tally_add(tally, until_ms, units, now)
    local field = 'r' .. string.format('%.0f', math.floor(until_ms / 1000))
    if redis.call('HINCRBY', tally, field, units) == units
      and redis.call('HLEN', tally) > TALLY_FIELDS then
      -- One HDEL for every ended second: each redis.call costs Redis more than the fields do.
      local second = math.floor(now / 1000)
      local ended = {}
      for _, name in ipairs(redis.call('HKEYS', tally)) do
        if string.byte(name, 1) == 114 then -- 'r'
          local s = tonumber(string.sub(name, 2))
          if s and s < second then
            ended[#ended + 1] = name
          end
        end
      end
      if #ended > 0 then
        redis.call('HDEL', tally, unpack(ended))
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

  -- The units that may still be given back at `now`, read by refusals only. `known`: how many of
  -- the hash's fields the caller read and knows not to be the tally's; a hash of no more fields
  -- holds no tally, and costs one HLEN (else the whole small hash is read).
  local function tally_units(tally, now, known)
    if redis.call('HLEN', tally) <= known then
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

  return tally_add, tally_remove, tally_units
end
