-- Sliding window counter: decide one hit and record it, atomically.
--
-- KEYS[1]  the limiter's counter hash. Field "<k>" holds the units recorded in fixed window k
--          (k = floor(now / window)); only windows k-1 and k matter, older fields are dropped.
-- ARGV[1]  limit L: units admitted per window, an integer in 0 .. 2^53-1
-- ARGV[2]  window W in milliseconds, an integer in 1 .. 2^40
-- ARGV[3]  cost c: 0 = check only (consume nothing), else the units to consume, 1 .. 2^53-1
--          (the caller saturates larger costs at 2^53-1)
-- ARGV[4]  counting: 0 = record admitted hits only; 1 = record refused hits too (a debit that
--          does not fit is still charged, as envoyproxy/ratelimit counts); absent = 0
-- ARGV[5]  refund horizon H in ms: 0 (or absent) for a final charge, which nothing gives back;
--          above 0 for a tentative one (a hit of a request with other limits, a leased slice):
--          the charge may be given back (counter_refund.lua) until F = now + H and never
--          after, and is tallied as refundable until then (refundable.lua)
-- ARGV[6]  optional decision time in ms since the epoch, for tests (ARGV[4] and ARGV[5] then
--          present); without it the server's clock (TIME) decides, so the clocks of the
--          tollgate instances do not matter
--
-- The caller leaves out ARGV[4] and ARGV[5] while they are 0, as they are for nearly every
-- hit: Redis makes every argument a Lua string before the script runs.
--
-- The hash also holds the refundable tally (fields "r<s>", see refundable.lua). A
-- refusal says, beside the time until the hit fits, the time it fits *certainly*: with every
-- unit still refundable taken off both windows' counts (the units are in one or the other, so
-- this is at most when the hit could fit after any refunds). An instance's local cache keeps a
-- refusal only that long, so no refund, from any instance, can make room behind it.
--
-- Reply, for an admitted charge on the plain path (nearly every call): the text
--   "<seconds> <microseconds> <prev> <curr>", the decision time as TIME gave it and the counts
--   of windows k-1 and k after the charge, all text the script already holds (TIME's reply,
--   the stored field, the count just written), so that nothing is formatted for it. The caller
--   derives the rest as this script would: now = seconds*1000 + floor(microseconds/1000),
--   k = floor(now / W), e = now - k*W, and remaining and reset_ms from prev, curr and e. Redis
--   turns a table answer into a reply by first probing the table for seven special fields,
--   making a string for each; counted on redis-server, answering this text instead saves the
--   script about 4,500 to 5,600 instructions a call (6.5 to 8%). A tentative charge answers the
--   same: its F is the decision time plus H.
-- Reply, otherwise: { admitted (1|0), remaining, reset_ms, k, extra }
--   admitted   c fits: used + c <= L (a check: used <= L)
--   remaining  floor((L*W - scaled_used) / W) after the charge, if any (at least 0)
--   reset_ms   admitted: time until every recorded unit has left the window;
--              refused: time until the same hit would be admitted if nothing else arrived
--   k          the fixed window the hit was added to (what a refund names)
--   extra      refused: the time until the hit fits certainly (at most reset_ms); admitted: F
--              for a tentative charge recorded, else 0
--
-- Invariants: a check never writes; an admitted hit never takes window k above L; a refused hit
-- writes only when ARGV[4] is 1, and then window k holds min(count + c, 2^53-1), so usage may be
-- above L and every computation below allows for it.
--
-- The math is the window spec of tollgate (src/window.rs), in integers scaled by W: used*W =
-- prev*(W-e) + curr*W. When (prev + curr + c + L + 1) * W is below 2^53, every product, sum and
-- quotient below is too, and plain Lua numbers decide exactly: that is the path nearly every
-- call takes, written with plain operators because a helper call per operation costs more Redis
-- CPU than the arithmetic. Beyond it (limits or counts near 2^53, or huge windows), the same
-- decision runs on exact helpers that switch to base-2^24 limbs above 2^53, defined only on that
-- path. Every value the script stores or returns is below 2^53.
--
-- The TTL is set on the first charge of a fixed window only: every later charge of the window
-- would set the same expiry instant (the end of window k+1 plus the margin), so repeating it
-- would cost a command and change nothing. The margin is min(5 s, W): an idle limiter's key is
-- gone at most 3W after its last charge for short windows, as late as it always was for long
-- ones.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 5 must be told to replicate effects, because TIME is read before writing. Redis 7,
  -- the first to set REDIS_VERSION_NUM, always replicates them, and would still pay a C call.
  redis.replicate_commands()
end

local BASE = 16777216 -- 2^24, one limb
local EXACT = 9007199254740992 -- 2^53, the first integer a Lua number may not hold exactly
local MAX_COUNT = EXACT - 1 -- the most one fixed window records
local MAX_MARGIN_MS = 5000 -- keys outlive their last useful instant by min(this, W)

-- Integers are printed through a C long ('%d'), which costs Redis far less than formatting a
-- double ('%.0f') and prints the same digits for every value stored (all below 2^53), where a
-- long has 64 bits; a server whose long is narrower keeps the double formatting. The width is
-- asked of the struct library Redis embeds ('l' is a C long) rather than found by formatting a
-- test number, which cost this script about 2,000 instructions a call, counted on redis-server.
local INT = '%.0f'
if struct.size('l') == 8 then
  INT = '%d'
end

local function int(n)
  return string.format(INT, n)
end

-- Records window k's new count and answers it as written; on the window's first charge, also
-- sets the key's expiry and drops the fields of windows older than k-1 (they can only be left
-- behind when the window index moves on, and a refund deletes a field it empties, so a first
-- charge is when to look), and the tally's fields of seconds that have ended.
local function record(key, k, field, start, window, now, count, first_in_window)
  local text = int(count)
  redis.call('HSET', key, field, text)
  if first_in_window then
    -- window k counts until the end of window k+1
    local margin = math.min(MAX_MARGIN_MS, window)
    redis.call('PEXPIRE', key, int(start + 2 * window - now + margin))
    if redis.call('HLEN', key) > 2 then
      local second = math.floor(now / 1000)
      for _, name in ipairs(redis.call('HKEYS', key)) do
        local index = tonumber(name)
        local drop = index == nil or index < k - 1
        if index == nil and string.byte(name, 1) == 114 then -- 'r': the tally's
          local s = tonumber(string.sub(name, 2))
          drop = s == nil or s < second
        end
        if drop then
          redis.call('HDEL', key, name)
        end
      end
    end
  end
  return text
end

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- The usual cost (1) is compared as text: parsing a number costs Redis a call to strtod.
local cost = ARGV[3] == '1' and 1 or tonumber(ARGV[3])
local count_refused = ARGV[4] == '1'
local horizon = 0
if ARGV[5] and ARGV[5] ~= '0' then
  horizon = tonumber(ARGV[5]) or 0
end
local now
local t -- the decision time as TIME answers it: seconds, microseconds
if ARGV[6] then
  now = tonumber(ARGV[6])
  t = { int(math.floor(now / 1000)), int(now % 1000 * 1000) }
else
  t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local k = math.floor(now / window)
if k * window > now then
  k = k - 1
end
local start = k * window
local elapsed = now - start

local field = int(k)
local counts = redis.call('HMGET', key, int(k - 1), field)
local prev = tonumber(counts[1]) or 0
local curr = tonumber(counts[2]) or 0

-- The plain path: every value below is an integer below 2^53 (see the header).
if (prev + curr + cost + limit + 1) * window < EXACT then
  local full = limit * window
  local scaled = prev * (window - elapsed) + curr * window
  local admitted
  if cost == 0 then
    admitted = scaled <= full
  elseif cost > limit then
    admitted = false
  else
    admitted = scaled + cost * window <= full
  end
  if cost > 0 and (admitted or count_refused) then
    -- curr + c is below 2^53, so the saturation of the wide path never applies here
    local first_in_window = curr == 0
    curr = curr + cost
    local curr_text = record(key, k, field, start, window, now, curr, first_in_window)
    if admitted and horizon > 0 then
      -- a tentative charge: refundable until F, and tallied as such until then
      local tally_add = refundable()
      tally_add(key, now + horizon, cost, now)
    end
    if admitted then
      -- The short reply (see the header). prev's stored text is answered as it is only when
      -- it is plain digits, as this script writes it: any other text it read as a number
      -- (written by something else) takes the table.
      if prev == 0 then
        return t[1] .. ' ' .. t[2] .. ' 0 ' .. curr_text
      elseif string.find(counts[1], '^%d+$') then
        return t[1] .. ' ' .. t[2] .. ' ' .. counts[1] .. ' ' .. curr_text
      end
    end
    scaled = scaled + cost * window
  end
  local remaining = 0
  if scaled < full then
    -- (full - scaled) + W <= (L + 1) * W: below 2^53, so the float quotient's floor is exact
    -- (the argument is at div_floor below)
    remaining = math.floor((full - scaled) / window)
  end
  -- When a refused hit of counts p (window k-1) and c (window k) fits, if nothing else arrives.
  local function retry_after(p, c)
    local budget = full - cost * window
    if p * (window - elapsed) + c * window <= budget then
      return 0
    end
    local curr_scaled = c * window
    if curr_scaled <= budget and p > 0 then
      return start + window - math.floor((budget - curr_scaled) / p) - now
    elseif c > 0 then
      return start + 2 * window - math.floor(budget / c) - now
    end
    return 0
  end
  local reset
  local extra = 0
  if admitted then
    if curr > 0 then
      reset = start + 2 * window - now
    elseif prev > 0 then
      reset = start + window - now
    else
      reset = 0
    end
    if cost > 0 and horizon > 0 then
      extra = now + horizon
    end
  elseif cost > limit then
    reset = window
    extra = window
  else
    reset = retry_after(prev, curr)
    -- the certain time: every refundable unit taken off both counts (see the header)
    local _, _, tally_units = refundable()
    local pending = tally_units(key, now, (counts[1] and 1 or 0) + (counts[2] and 1 or 0))
    if pending == 0 then
      extra = reset
    else
      extra = retry_after(math.max(0, prev - pending), math.max(0, curr - pending))
      if extra > reset then
        extra = reset
      end
    end
    if extra < 0 then
      extra = 0
    end
  end
  return { admitted and 1 or 0, remaining, reset, k, extra }
end

-- The wide path: the same decision on exact integers of any size.

-- Exact non-negative integers: a Lua number when below 2^53, else a table of limbs, least
-- significant first, with no leading zero limb.
local function limbs(a)
  if type(a) == 'table' then
    return a
  end
  local t = {}
  repeat
    local q = math.floor(a / BASE)
    t[#t + 1] = a - q * BASE
    a = q
  until a == 0
  return t
end

local function normalize(t)
  while #t > 1 and t[#t] == 0 do
    t[#t] = nil
  end
  -- three limbs with a top limb below 2^5 are below 2^53: back to a plain number
  if #t < 3 or (#t == 3 and t[3] < 32) then
    local n = 0
    for i = #t, 1, -1 do
      n = n * BASE + t[i]
    end
    return n
  end
  return t
end

local function add(a, b)
  if type(a) == 'number' and type(b) == 'number' and a + b < EXACT then
    return a + b
  end
  local x, y = limbs(a), limbs(b)
  local r, carry = {}, 0
  for i = 1, math.max(#x, #y) do
    local s = (x[i] or 0) + (y[i] or 0) + carry
    carry = math.floor(s / BASE)
    r[i] = s - carry * BASE
  end
  if carry > 0 then
    r[#r + 1] = carry
  end
  return normalize(r)
end

-- a - b, for a >= b
local function sub(a, b)
  if type(a) == 'number' and type(b) == 'number' then
    return a - b
  end
  local x, y = limbs(a), limbs(b)
  local r, borrow = {}, 0
  for i = 1, #x do
    local d = x[i] - (y[i] or 0) - borrow
    if d < 0 then
      d = d + BASE
      borrow = 1
    else
      borrow = 0
    end
    r[i] = d
  end
  return normalize(r)
end

local function mul(a, b)
  if type(a) == 'number' and type(b) == 'number' and a * b < EXACT then
    return a * b
  end
  local x, y = limbs(a), limbs(b)
  local r = {}
  for i = 1, #x + #y do
    r[i] = 0
  end
  for i = 1, #x do
    local carry = 0
    for j = 1, #y do
      -- a limb product is below 2^48, so this sum stays exact
      local s = r[i + j - 1] + x[i] * y[j] + carry
      carry = math.floor(s / BASE)
      r[i + j - 1] = s - carry * BASE
    end
    local k = i + #y
    while carry > 0 do
      local s = r[k] + carry
      carry = math.floor(s / BASE)
      r[k] = s - carry * BASE
      k = k + 1
    end
  end
  return normalize(r)
end

-- -1, 0 or 1 as a <, =, > b
local function cmp(a, b)
  local an, bn = type(a) == 'number', type(b) == 'number'
  if an and bn then
    if a < b then return -1 elseif a > b then return 1 else return 0 end
  end
  if an then return -1 end -- a number is below 2^53, a table is not
  if bn then return 1 end
  if #a ~= #b then
    if #a < #b then return -1 else return 1 end
  end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then
      if a[i] < b[i] then return -1 else return 1 end
    end
  end
  return 0
end

local function approx(a)
  if type(a) == 'number' then
    return a
  end
  local n = 0
  for i = #a, 1, -1 do
    n = n * BASE + a[i]
  end
  return n
end

-- floor(a / d) for d >= 1 below 2^53, when the quotient is known to be below 2^53: a floating
-- estimate, then corrected until q*d <= a < (q+1)*d holds exactly.
local function div_floor(a, d)
  if type(a) == 'number' and a + d < EXACT then
    -- a/d = q + r/d with r < d lies at least 1/d below q + 1, while rounding moves it by at
    -- most (q + 1) / 2^53 <= (a + d) / (d * 2^53) < 1/d: the float's floor is exactly q
    return math.floor(a / d)
  end
  local q = math.floor(approx(a) / d)
  if q >= EXACT then
    q = EXACT - 1
  end
  while q > 0 and cmp(mul(q, d), a) > 0 do
    q = q - 1
  end
  while cmp(mul(q + 1, d), a) <= 0 do
    q = q + 1
  end
  return q
end

local full = mul(limit, window)
local scaled = add(mul(prev, window - elapsed), mul(curr, window))

local admitted
if cost == 0 then
  -- a check passes unless usage is above the limit
  admitted = cmp(scaled, full) <= 0
elseif cost > limit then
  admitted = false
else
  admitted = cmp(add(scaled, mul(cost, window)), full) <= 0
end

if cost > 0 and (admitted or count_refused) then
  local first_in_window = curr == 0
  -- an admitted charge stays within L; a refused one saturates at MAX_COUNT
  local after = add(curr, cost)
  if cmp(after, MAX_COUNT) > 0 then
    after = MAX_COUNT
  end
  curr = after
  record(key, k, field, start, window, now, curr, first_in_window)
  if admitted and horizon > 0 then
    local tally_add = refundable()
    tally_add(key, now + horizon, cost, now)
  end
  scaled = add(mul(prev, window - elapsed), mul(curr, window))
end

local remaining = 0
if cmp(scaled, full) < 0 then
  remaining = div_floor(sub(full, scaled), window)
end

local reset
if admitted then
  if curr > 0 then
    reset = start + 2 * window - now
  elseif prev > 0 then
    reset = start + window - now
  else
    reset = 0
  end
elseif cost > limit then
  -- it can never fit: the full window
  reset = window
else
  -- the budget the recorded hits may use, scaled by W, for this hit to fit (they include this
  -- hit when it was charged)
  local budget
  if cost == 0 then
    budget = full
  else
    budget = sub(full, mul(cost, window))
  end
  local curr_scaled = mul(curr, window)
  if cmp(curr_scaled, budget) <= 0 and prev > 0 then
    -- fits later in this window, once enough of prev has slid out
    reset = start + window - div_floor(sub(budget, curr_scaled), prev) - now
  elseif curr > 0 then
    -- fits in the next window, once enough of curr has slid out
    reset = start + 2 * window - div_floor(budget, curr) - now
  else
    reset = 0
  end
end

-- Counts this large are not worth the exact certain time: with anything refundable, the
-- refusal is certain for no time at all (the cache then does not keep it).
local extra = 0
if admitted then
  if cost > 0 and horizon > 0 then
    extra = now + horizon
  end
elseif cost > limit then
  extra = window
else
  local _, _, tally_units = refundable()
  if tally_units(key, now, (counts[1] and 1 or 0) + (counts[2] and 1 or 0)) == 0 then
    extra = reset
  end
end

return { admitted and 1 or 0, remaining, reset, k, extra }
