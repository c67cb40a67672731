-- The limits of one descriptor (`rate_limits`): decide one hit against every one of them, and
-- charge it to all or none, atomically.
--
-- This driver is not a script of its own: scripts.rs appends it to counter.lua, log.lua,
-- counter_refund.lua and log_refund.lua (each with refundable.lua before it, as it runs alone),
-- each wrapped as a local function of (KEYS, ARGV): decide_counter, decide_log, refund_counter,
-- refund_log. Each limit is decided by its own script, unchanged, on its own keys and arguments.
--
-- KEYS     the keys of every limit in turn, each limit's as its own script takes them
--          (a counter: its hash; a log: its sorted set and the hash beside it)
-- ARGV[1]  n: the number of limits
-- then, for each limit in turn:
--          its algorithm: 'c' (counter.lua) or 'l' (log.lua)
--          the number of its keys
--          m: the number of its arguments
--          its m arguments, exactly as its own script takes them (options left out while 0, a
--          test's decision time last)
--
-- Reply: { undone (1|0), reply of limit 1, ..., reply of limit n }, each limit's reply exactly
-- as its own script answers it (the short text of an admitted charge, or the table).
--   undone   1 when a limit refused the hit: every charge of the others that counts admitted
--            hits only was given back, in this call. Their replies still say what their own
--            limits admitted; what they charged is no longer there.
--
-- Invariants: every limit is decided, in order, even after one refused, so each reply is what
-- that limit alone would answer at this instant (and a limit with counting=1 records a refused
-- hit, as alone). After a refusal, an admitted charge (cost above 0) of a limit with counting
-- 0 is given back by its refund script with what its reply names (k or the entry id, the cost,
-- F and the units to untally for a tentative charge, the test's time), so the keys hold the
-- same usage as if the hit had never come; a limit with counting=1 keeps its charge, as it
-- would alone. A check (cost 0) writes nothing and has nothing to give back. All of it runs in
-- one script: no other client sees the charges that are given back.

local n = tonumber(ARGV[1])
local reply = { 0 }
local decided = {} -- per limit: algorithm, keys, argv, answer
local refused = false
local at_key, at_arg = 1, 2
for i = 1, n do
  local algorithm = ARGV[at_arg]
  local key_count = tonumber(ARGV[at_arg + 1])
  local arg_count = tonumber(ARGV[at_arg + 2])
  local keys, argv = {}, {}
  for j = 1, key_count do
    keys[j] = KEYS[at_key + j - 1]
  end
  for j = 1, arg_count do
    argv[j] = ARGV[at_arg + 2 + j]
  end
  at_key = at_key + key_count
  at_arg = at_arg + 3 + arg_count
  local answer
  if algorithm == 'c' then
    answer = decide_counter(keys, argv)
  else
    answer = decide_log(keys, argv)
  end
  reply[i + 1] = answer
  -- a text answer is an admitted, recorded charge; a table says whether it was admitted
  if type(answer) == 'table' and answer[1] == 0 then
    refused = true
  end
  decided[i] = { algorithm, keys, argv, answer }
end

if refused then
  reply[1] = 1
  for i = n, 1, -1 do
    local algorithm, keys, argv, answer = unpack(decided[i])
    local admitted = type(answer) ~= 'table' or answer[1] == 1
    local cost = argv[3]
    if admitted and cost ~= '0' and argv[4] ~= '1' then
      if algorithm == 'c' then
        -- k, and F for a tentative charge (its decision time plus the horizon H, ARGV[5])
        local k, until_ms
        if type(answer) == 'table' then
          k, until_ms = answer[4], answer[5]
        else
          local seconds, micros = string.match(answer, '^(%d+) (%d+) ')
          local now = tonumber(seconds) * 1000 + math.floor(tonumber(micros) / 1000)
          local window = tonumber(argv[2])
          k = math.floor(now / window)
          if k * window > now then
            k = k - 1
          end
          until_ms = 0
          local horizon = tonumber(argv[5] or '0') or 0
          if horizon > 0 then
            until_ms = now + horizon
          end
        end
        local untally = '0'
        if until_ms > 0 then
          untally = cost
        end
        refund_counter(keys, {
          string.format('%.0f', k), cost, string.format('%.0f', until_ms), untally, argv[6]
        })
      else
        -- the entry's id, and F for a tentative charge
        local id, until_ms
        if type(answer) == 'table' then
          id, until_ms = string.format('%.0f', answer[4]), string.format('%.0f', answer[5])
        else
          id, until_ms = string.match(answer, '^(%d+) %d+ ?(%d*)$')
          if until_ms == '' then
            until_ms = '0'
          end
        end
        local untally = '0'
        if until_ms ~= '0' then
          untally = cost
        end
        refund_log(keys, { id, cost, '0', until_ms, untally, argv[7] })
      end
    end
  end
end

return reply
