-- Store items once each: an item's id is the fingerprint of the request whose
-- response yielded it and its position in the callback's output, so a page crawled
-- twice (a worker died before its ack) or a call sent twice stores nothing new.
-- Ids are remembered for the dedup window only (by Redis's clock), so the id
-- zset holds the ids of that window, not of every item ever stored.
-- A call sent again (its reply was lost: redis-py's retry, or the pipeline's own)
-- answers what it did the first time, from the caller's record of its last call:
-- "already stored" would hide from the caller that the first send stored them,
-- and the caller must know which server holds the last item it wrote.
-- KEYS[1] items list, KEYS[2] set of ids of earlier versions, which kept every id
-- (read and given an expiry, never added to),
-- KEYS[3] zset of recent ids -> when stored (ms), KEYS[4] the caller's record of its
-- last call (the call's token, then its replies as digits)
-- ARGV[1] the dedup window (ms), ARGV[2] the call's token (the same when sent again),
-- ARGV[3] how long the record is kept (ms), then for each item: its id, its JSON
-- Returns for each item 1 when stored, 0 when an item with its id was stored within
-- the window (an id twice in one call: the second is not stored).
local token = ARGV[2]
local record = redis.call('GET', KEYS[4])
if record and string.sub(record, 1, #token + 1) == token .. ':' then
  local replies = {}
  for i = #token + 2, #record do replies[#replies + 1] = string.byte(record, i) - 48 end
  return replies
end
-- The set of earlier versions is bounded by the same window: the first call that finds
-- it without an expiry gives it one of one window (NX: later calls leave it as it is).
-- Every id in it was stored before that call, so one window later each is older than
-- the window, as an id the zset drops: the set goes whole then, and until then it is
-- read below, so its ids are stored once within the window. (A worker of an earlier
-- version still running in a rolling upgrade may add ids that then get less than a
-- window; should it make the set again after it expired, the next call gives that one
-- its expiry too.) Only a deployment that has the set runs PEXPIRE, and under pcall: a
-- worker's ACL user made before it was in the role's commands keeps storing items
-- (its set then stays as it was, unbounded; Redis's ACL LOG names the refusal).
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.pcall('PEXPIRE', KEYS[2], ARGV[1], 'NX')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[1])))
local stored, replies = {}, {}
for i = 4, #ARGV - 1, 2 do
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
redis.call('SET', KEYS[4], token .. ':' .. table.concat(replies), 'PX', ARGV[3])
return replies
