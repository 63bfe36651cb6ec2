-- The workers of a spider's frontier that are alive: a zset worker -> the deadline of
-- its presence (ms of Redis TIME, never a worker's clock), renewed with its leases.
-- KEYS[1] {<spider>:stats}:workers; ARGV[1] 'here' or 'gone', ARGV[2] the worker,
-- ARGV[3] ('here') how long its presence lasts unrenewed, ms.
-- here: record the worker; returns 0. gone: forget it; returns how many other workers
-- are alive (a worker stopped or killed without a word stays counted until its
-- deadline, as its leases do). Safe to send twice.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'here' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
