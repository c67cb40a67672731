-- The permission check: runs every command the other scripts of lua/ run, on keys of its own, and
-- answers the ones the server refused. tollgate sends it (EVAL) on every new connection, before
-- serving from it, so that a Redis user whose ACL lets it call the scripts but not the commands
-- inside them is found at start-up, named, instead of failing every decision.
--
-- KEYS[1]  a sorted set of the check's own under the key prefix (a log's key, see log.lua)
-- KEYS[2]  a hash beside it, in the same hash slot (a log's hash, or a counter's)
-- ARGV     none
--
-- Reply: { command_1, error_1, command_2, error_2, ... } for every command that failed, in the
--   order run; empty when every one ran. The caller tells a permission refused ("can't run this
--   command", "can't access ... keys", NOPERM) from any other failure (say OOM on a write).
--
-- Invariants: the commands are those of counter.lua, log.lua, counter_refund.lua, log_refund.lua,
-- refundable.lua and group.lua, each at least once (a unit test in permissions.rs holds this list
-- to the scripts); only KEYS[1] and KEYS[2] are touched, and both are deleted before the reply, so
-- running the check again, from any instance, changes nothing.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 5 must be told to replicate effects, because TIME is read before writing.
  redis.replicate_commands()
end

local zset = KEYS[1]
local hash = KEYS[2]
local refused = {}

local function try(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    refused[#refused + 1] = command
    refused[#refused + 1] = reply.err
  end
end

try('TIME')
try('HSET', hash, 'f', '1')
try('HINCRBY', hash, 'f', '1')
try('HGET', hash, 'f')
try('HMGET', hash, 'f', 'g')
try('HGETALL', hash)
try('HKEYS', hash)
try('HLEN', hash)
try('HDEL', hash, 'g')
try('PEXPIRE', hash, '60000')
-- An instant far ahead (year 5138): the key is deleted below anyway.
try('PEXPIREAT', hash, '99999999999999')
try('ZADD', zset, '0', 'm')
try('ZCARD', zset)
try('ZSCORE', zset, 'm')
try('ZRANGE', zset, '0', '0')
try('ZRANGEBYSCORE', zset, '0', '0')
try('ZREMRANGEBYSCORE', zset, '1', '2')
try('ZREM', zset, 'm')
try('DEL', zset, hash)
return refused
