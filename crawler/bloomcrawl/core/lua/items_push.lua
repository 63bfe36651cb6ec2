-- Store an item once: its id is the fingerprint of the request whose response
-- yielded it and its position in the callback's output, so a page crawled
-- twice (a worker died before its ack) or a call sent twice stores nothing new.
-- Ids are remembered for the dedup window only (by Redis's clock), so the id
-- zset holds the ids of that window, not of every item ever stored.
-- KEYS[1] items list, KEYS[2] set of ids of before the window (read, never written),
-- KEYS[3] zset of recent ids -> when stored (ms)
-- ARGV[1] item id, ARGV[2] item JSON, ARGV[3] the dedup window (ms)
-- Returns 1 when stored, 0 when an item with this id was stored within the window.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[3])))
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 0 end
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[2])
return 1
