-- Forget one limiter's window, for an operator's reset (POST /counters/reset,
-- `tollgate counters reset`): every key of it is deleted.
--
-- KEYS     every key of the window, all in one slot: a counter's hash (counts and refundable
--          tally), or a log's sorted set and the hash beside it (sum, last id, expiry, tally)
-- ARGV     none
--
-- Reply: how many of the keys existed.
--
-- Invariants: safe to repeat (a second call deletes nothing and answers 0). The refundable
-- tally and the slices leases reserved live in these keys and go with them: a refund or a
-- lease's settlement arriving afterwards finds nothing and gives nothing back
-- (counter_refund.lua and log_refund.lua answer 0), so a reset never leaves a count below 0.

return redis.call('DEL', unpack(KEYS))
