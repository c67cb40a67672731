-- Sliding window log: decide one hit and record it, atomically.
--
-- KEYS[1]  the limiter's log: a sorted set with one member per recorded hit, scored by the hit's
--          time in ms; the member is "<id>:<cost>", so a hit of cost 100 is one member
-- KEYS[2]  the log's hash beside it: field "sum" = total cost of the members, field "seq" = the
--          last entry id handed out, field "exp" = when the keys were last set to expire, in
--          ms since the epoch on the server's clock (see the invariants)
-- ARGV[1]  limit L: units admitted per window, an integer in 0 .. 2^53-1
-- ARGV[2]  window W in milliseconds, an integer in 1 .. 2^40
-- ARGV[3]  cost c: 0 = check only (consume nothing), else the units to consume, 1 .. L+1
--          (the caller clamps larger costs to L+1: a cost above L is refused, and while an
--          entry of L+1 is in the window usage is above L, just as with any larger cost)
-- ARGV[4]  counting: 0 = record admitted hits only; 1 = record refused hits too (a debit that
--          does not fit is still charged, as envoyproxy/ratelimit counts); absent = 0
-- ARGV[5]  ahead: 0 for an ordinary hit; for a slice (leased, or an RLQS assignment), the time
--          in ms its hits may be admitted after the decision (at most a quarter of the window
--          and 4000, below the margin; a larger one is read as that; the caller sends a lease's
--          at most a tenth and 1000): the entry is stamped this far after the decision, because
--          the slice's hits may be admitted until then and must stay in the window as long as
--          hits admitted then would; absent = 0
-- ARGV[6]  refund horizon H in ms: 0 (or absent) for a final charge, which nothing gives back;
--          above 0 for a tentative one (a hit of a request with other limits, a leased slice):
--          the charge may be given back (log_refund.lua) until F = stamp + H and never after,
--          and until then it is tallied as refundable (see "refundable" below)
-- ARGV[7]  optional decision time in ms since the epoch, for tests (ARGV[4] to ARGV[6] then
--          present); without it the server's clock (TIME) decides
--
-- The caller leaves out ARGV[4] to ARGV[6] while they are 0, as they are for nearly every hit:
-- Redis builds ARGV as a Lua table one argument at a time, and a fifth argument makes it grow
-- its table a second time (counted on redis-server, the two cost this script about 2,600
-- instructions a call, 2.4%).
--
-- Refundable: the hash KEYS[2] tallies the units of tentative charges by the second their
-- horizon ends in, field "r<floor(F/1000)>" (see refundable.lua). A refusal computes, beside the time until the hit fits, the time it fits *certainly*: with every
-- unit still refundable (in a field whose second has not ended) given back at once. An
-- instance's local cache keeps a refusal only that long, so no refund, from any instance, can
-- make room behind it.
--
-- Reply, for an admitted hit that recorded an entry (nearly every call): the text "<id> <sum>",
--   the entry's id and the log's sum after it (a tentative charge: "<id> <sum> <F>"). The caller knows the rest: remaining = L - sum
--   (an admitted hit leaves the sum at most L), reset_ms = W + ahead. Redis turns a table
--   answer into a reply by first probing the table for seven special fields, making a string
--   for each; counted on redis-server, answering this text instead of the table saves the
--   script about 5,400 instructions a call (5.3%).
-- Reply, otherwise: { admitted (1|0), remaining, reset_ms, id, extra }
--   admitted   c fits: used + c <= L (a check: used <= L)
--   remaining  L - used after the charge, if any (at least 0)
--   reset_ms   admitted: time until the newest entry leaves the window (0 when the log is empty;
--              the window plus ahead for a recorded entry);
--              refused: time until enough of the oldest entries have left for the hit to fit
--   id         the id of the entry recorded (0 when nothing was recorded); a refund names it
--   extra      refused: the time until the hit fits certainly (at most reset_ms; see
--              "refundable"); admitted: F for a tentative charge recorded, else 0
--
-- Invariants: a check never adds an entry; an admitted hit never takes the sum above L; a refused
-- hit adds an entry of min(c, L+1) only when ARGV[4] is 1, so the sum may be above L. An entry at
-- time x is inside the window at t iff x > t - W; entries stamped ahead count in full from the
-- moment they are added. The margin M is min(5 s, W): an idle log's keys are gone 3W after its
-- last hit at most for short windows, and the margin of long windows is what it always was.
-- Every key outlives its newest entry's stay in the window (ahead is at most W/4, below M, so
-- a later call's PEXPIRE never cuts an earlier entry short), and both keys always carry the
-- same expiry. A recorded hit sets the expiry a second M later, stamp + W + 2M, and records it
-- as "exp" (an entry stamped further ahead than a lease's time, E = min(W/10, 1 s), records
-- now + E + W + 2M, less than it sets); every other call that sets an expiry (the drop of
-- expired entries below, a test's call, the versions before "exp") sets at least its
-- now + W + M. Neither key therefore expires before exp - M - E, and a recorded hit whose entry leaves the window EXP_SLACK_MS
-- before that need not set the expiry again: for about three seconds after each setting, a hit runs two commands fewer
-- (counted on redis-server, about 5,600 instructions a call, 5%, when a log is hit about every
-- second; a log hit less often than every three seconds pays about 1% for "exp"). Costs,
-- sums and ids stay below 2^53, so plain Lua numbers are exact here.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 5 must be told to replicate effects, because TIME is read before writing. Redis 7,
  -- the first to set REDIS_VERSION_NUM, always replicates them, and would still pay a C call.
  redis.replicate_commands()
end

local MAX_MARGIN_MS = 5000 -- keys outlive their newest entry by min(this, W)
local MAX_AHEAD_MS = 4000 -- the longest time ahead: a larger ARGV[5] is read as this
local LEASE_AHEAD_MS = 1000 -- the longest time ahead "exp" accounts for (a lease's)
local EXP_SLACK_MS = 1000 -- an entry leaves this long before its keys may, to skip PEXPIREAT
local SCAN = 64 -- the most entries read per step when looking for the retry time

-- Integers are printed through a C long ('%d'), which costs Redis far less than formatting a
-- double ('%.0f') and prints the same digits for every value here (all below 2^53), where a
-- long has 64 bits; a server whose long is narrower keeps the double formatting. The width is
-- asked of the struct library Redis embeds ('l' is a C long) rather than found by formatting a
-- test number, which cost this script about 1,500 instructions a call, counted on redis-server.
-- They are formatted where they are used: counted on redis-server, formatting them through a
-- helper function cost this script about 3,000 instructions a call more (2.6%).
local INT = '%.0f'
if struct.size('l') == 8 then
  INT = '%d'
end

local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end

local log = KEYS[1]
local meta = KEYS[2]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- The usual cost (1) and lease time (0, or absent) are compared as text: parsing a number
-- costs Redis a call to strtod.
local cost = ARGV[3] == '1' and 1 or tonumber(ARGV[3])
local count_refused = ARGV[4] == '1'
-- Plain comparisons rather than math.min: every call pays for these, and a call into a C
-- function costs Redis more than the arithmetic.
local margin = MAX_MARGIN_MS
if window < MAX_MARGIN_MS then
  margin = window
end
local max_ahead = MAX_AHEAD_MS
if window < 4 * MAX_AHEAD_MS then
  max_ahead = math.max(1, math.floor(window / 4))
end
local ahead = 0
if ARGV[5] and ARGV[5] ~= '0' then
  ahead = math.min(tonumber(ARGV[5]) or 0, max_ahead)
end
-- What "exp" allows for the time ahead of the entry that recorded it (see the invariants).
local exp_ahead = LEASE_AHEAD_MS
if window < 10 * LEASE_AHEAD_MS then
  exp_ahead = math.max(1, math.floor(window / 10))
end
local horizon = 0
if ARGV[6] and ARGV[6] ~= '0' then
  horizon = tonumber(ARGV[6]) or 0
end
local test_time = ARGV[7]
local now
if test_time then
  now = tonumber(test_time)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- forget the entries that have left the window, and their costs
local cutoff = string.format(INT, now - window)
local expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
local state = redis.call('HMGET', meta, 'sum', 'seq', 'exp')
local used = tonumber(state[1])
local seq = tonumber(state[2])
local changed = false
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  if used then
    for i = 1, #expired do
      used = used - cost_of(expired[i])
    end
  end
  changed = true
end
-- Members are counted only when the sum cannot vouch for them. A positive sum means members:
-- every member costs at least 1, every script that changes one key changes the other, and both
-- keys always get the same expiry, the hash's first, so the hash never outlives the log with a
-- sum of members that expired with it. The common call skips the count; nil stands for "at
-- least one" below.
local entries = nil
if used == nil or used <= 0 then
  entries = redis.call('ZCARD', log)
  if entries == 0 then
    used = 0
  elseif used == nil or used < 0 then
    -- the sum was lost (or damaged): rebuild it from the members
    used = 0
    for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
      used = used + cost_of(member)
    end
    changed = true
  end
end

local admitted
if cost == 0 then
  -- a check passes unless usage is above the limit
  admitted = used <= limit
elseif cost > limit then
  admitted = false
else
  admitted = used + cost <= limit
end

-- the entry this hit leaves: its cost when admitted, at most L+1 when refused and counted
local entry = 0
if cost > 0 and admitted then
  entry = cost
elseif cost > 0 and count_refused then
  entry = math.min(cost, limit + 1)
end

local id = 0
if entry > 0 then
  -- ids start from the clock so that a log recreated after expiry does not reuse them
  id = (seq or now * 1000) + 1
  used = used + entry
  -- only an admitted slice is stamped ahead: a refused entry records a debit made now
  local stamp = now
  if admitted then
    stamp = now + ahead
  end
  -- The id is formatted once, for the member and the hash alike, and the usual cost of 1 is
  -- appended as text: counted on redis-server, formatting the member and the id apart cost
  -- this script about 1,900 instructions a call more (1.8%).
  local text_id = string.format(INT, id)
  local member
  if entry == 1 then
    member = text_id .. ':1'
  else
    member = text_id .. ':' .. string.format(INT, entry)
  end
  redis.call('ZADD', log, string.format(INT, stamp), member)
  local used_text = string.format(INT, used)
  -- Whether the keys' expiry must be set again (see the invariants).
  local exp = tonumber(state[3])
  if test_time then
    -- A decision time given by a test is not the server's clock, which expiry runs on: the
    -- expiry is set from the server's clock, and no time is recorded.
    redis.call('HSET', meta, 'sum', used_text, 'seq', text_id)
    local ttl = string.format(INT, window + (stamp - now) + 2 * margin)
    redis.call('PEXPIRE', meta, ttl)
    redis.call('PEXPIRE', log, ttl)
  elseif exp and stamp + window + EXP_SLACK_MS + margin + exp_ahead <= exp then
    -- the keys outlive this entry's stay already (see the invariants)
    redis.call('HSET', meta, 'sum', used_text, 'seq', text_id)
  else
    local at = string.format(INT, stamp + window + 2 * margin)
    -- "exp" counts at most exp_ahead of this entry's time ahead, so that a later writer's
    -- expiry (its now + W + M at least) is never more than M + exp_ahead before it; an entry
    -- stamped further ahead (an RLQS slice) keeps its longer expiry on the keys.
    local recorded = at
    if stamp - now > exp_ahead then
      recorded = string.format(INT, now + exp_ahead + window + 2 * margin)
    end
    redis.call('HSET', meta, 'sum', used_text, 'seq', text_id, 'exp', recorded)
    redis.call('PEXPIREAT', meta, at)
    redis.call('PEXPIREAT', log, at)
  end
  if admitted then
    if horizon > 0 then
      -- a tentative charge: refundable until F, and tallied as such until then
      local until_ms = stamp + horizon
      local tally_add = refundable()
      tally_add(meta, until_ms, entry, now)
      return text_id .. ' ' .. used_text .. ' ' .. string.format(INT, until_ms)
    end
    -- the short reply (see the header), from the two numbers already formatted for the hash
    return text_id .. ' ' .. used_text
  end
elseif changed then
  if entries == 0 then
    redis.call('DEL', meta)
  else
    redis.call('HSET', meta, 'sum', string.format(INT, used))
    local ttl = string.format(INT, window + margin)
    redis.call('PEXPIRE', meta, ttl)
    redis.call('PEXPIRE', log, ttl)
  end
end

local remaining = limit - used
if remaining < 0 then
  remaining = 0
end

local reset = 0
-- refused: how long the refusal stands whatever refundable charges are given back (see
-- "refundable" in the header); admitted: 0
local certain = 0
if admitted then
  if cost > 0 then
    reset = window + ahead
  elseif entries ~= 0 then
    local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + window - now
  end
elseif cost > limit then
  -- it can never fit, whatever is given back: the full window
  reset = window
  certain = window
else
  -- drop the oldest entries (this hit's own included, when it was recorded) until the hit
  -- fits; it fits once the last one dropped has left. With every refundable unit given back it
  -- fits once the log is down to target + refundable: the same walk says when, first.
  local target = limit - cost
  local known = (state[1] and 1 or 0) + (state[2] and 1 or 0) + (state[3] and 1 or 0)
  local _, _, tally_units = refundable()
  local pending = tally_units(meta, now, known)
  reset = window -- unless the entries say sooner (they always do while the sum agrees with them)
  certain = -1
  local left = used
  if left <= target + pending then
    certain = 0
  end
  local from = 0
  -- Every entry costs at least 1, so at most used - target of the oldest must leave: the first
  -- step reads no more than that (a hit one over a full log of single hits reads one entry,
  -- not 64), and only a sum that disagrees with the entries takes a second step.
  local step = math.min(SCAN, used - target)
  while left > target do
    local batch = redis.call('ZRANGE', log, from, from + step - 1, 'WITHSCORES')
    if #batch == 0 then
      break
    end
    for i = 1, #batch, 2 do
      left = left - cost_of(batch[i])
      if certain < 0 and left <= target + pending then
        certain = tonumber(batch[i + 1]) + window - now
      end
      if left <= target then
        reset = tonumber(batch[i + 1]) + window - now
        break
      end
    end
    from = from + step
    step = step * 2
  end
  if certain < 0 or certain > reset then
    certain = reset
  end
end
if reset < 0 then
  reset = 0
end
if certain < 0 then
  certain = 0
end

return { admitted and 1 or 0, remaining, reset, id, certain }
