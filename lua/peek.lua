-- Read one limiter's window as it stands, for an operator asking about a client's usage
-- (POST /counters, `tollgate counters get`). Nothing is charged, written or extended.
--
-- KEYS[1]  the window's main key: a counter's hash of per-window counts (counter.lua) or a
--          log's sorted set of entries (log.lua)
-- ARGV[1]  algorithm: 0 = sliding window counter, 1 = sliding window log
-- ARGV[2]  window W in milliseconds, an integer in 1 .. 2^40
-- ARGV[3]  optional read time in ms since the epoch, for tests; without it the server's clock
--          (TIME) reads, as the deciding scripts do
--
-- Reply: { now, a, b }
--   now  the read time in ms since the epoch
--   counter: a = the units recorded in fixed window k-1, b = those in window k
--            (k = floor(now / W)); a missing field is 0, as counter.lua reads it
--   log:     a = the sum of the costs of the entries inside the window (score > now - W;
--            entries stamped ahead, leased slices, count in full, as log.lua counts them),
--            b = the score of the newest of them (0 when there is none)
--
-- The caller computes usage, what is left and the reset from these with the window math of
-- src/window.rs (src/backend/inspect.rs), as a check-only decision would.
--
-- Invariants: read-only (TIME, HMGET, ZRANGEBYSCORE only): no key is created, no TTL moved,
-- nothing pruned, so a peek can be repeated any number of times and never changes a decision.
-- A log member is "<id>:<cost>" (log.lua); every value is an integer below 2^53.

local now
if ARGV[3] then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local window = tonumber(ARGV[2])

if ARGV[1] == '0' then
  local k = math.floor(now / window)
  local counts = redis.call('HMGET', KEYS[1],
    string.format('%.0f', k - 1), string.format('%.0f', k))
  return { now, tonumber(counts[1]) or 0, tonumber(counts[2]) or 0 }
end

local entries = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now - window),
  '+inf', 'WITHSCORES')
local sum = 0
local newest = 0
for i = 1, #entries, 2 do
  local cost = tonumber(string.match(entries[i], ':(%d+)$')) or 0
  sum = sum + cost
  local score = tonumber(entries[i + 1])
  if score > newest then
    newest = score
  end
end
return { now, sum, newest }
