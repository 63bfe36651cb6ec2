#!lua flags=allow-oom
-- Extend the deadlines of leases still held (XX: never recreate a lost one; GT: never
-- bring one forward, as a lease taken for a later time has a deadline past now's).
-- KEYS[1] deadlines zset; ARGV[1] lease ms, ARGV[2..] tokens.
-- Returns the tokens that were no longer held (their leases expired and were reaped).
-- allow-oom: it only moves the scores of existing members, so it runs while Redis
-- refuses writes for memory (noeviction): a worker whose page waits to store its items
-- keeps its leases through the outage instead of seeing them crawled again.
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', deadline, ARGV[i]) == 0
      and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
