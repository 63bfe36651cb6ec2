-- When a partition's next host may be leased, read only: what frontier_lease.lua's
-- reply says after a lease, for the partitions a worker would otherwise ask one lease
-- call at a time. KEYS[1] ready zset, KEYS[2] queued count (polite_common.lua)
-- Returns the ms until then: 0 now, -1 nothing queued, -2 requests queued but every
-- host with some at its concurrency.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
if #first > 0 then return math.max(0, tonumber(first[2]) - now) end
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then return -2 end
return -1
