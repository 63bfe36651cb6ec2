-- Store items once each: an item's id is the fingerprint of the request whose
-- response yielded it and its position in the callback's output, so a page crawled
-- twice (a worker died before its ack) or a call sent twice stores nothing new.
-- Ids are remembered for the dedup window only (by Redis's clock), so the id
-- zset holds the ids of that window, not of every item ever stored.
-- KEYS[1] items list, KEYS[2] set of ids of before the window (read, never written),
-- KEYS[3] zset of recent ids -> when stored (ms)
-- ARGV[1] the dedup window (ms), then for each item: its id, its JSON
-- Returns for each item 1 when stored, 0 when an item with its id was stored within
-- the window (an id twice in one call: the second is not stored).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[1])))
local stored, replies = {}, {}
for i = 2, #ARGV - 1, 2 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[3], id) or redis.call('SISMEMBER', KEYS[2], id) == 1 then
    replies[#replies + 1] = 0
  else
    redis.call('ZADD', KEYS[3], now, id)
    stored[#stored + 1] = ARGV[i + 1]
    replies[#replies + 1] = 1
  end
end
-- in order, in chunks that unpack() takes
for first = 1, #stored, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(stored, first, math.min(first + 999, #stored)))
end
return replies
