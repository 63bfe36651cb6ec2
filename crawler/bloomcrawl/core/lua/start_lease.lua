-- Lease start URLs like requests: they move from the start list into a lease
-- hash with a deadline, and are acked once the requests made of them are queued.
-- KEYS[1] start list, KEYS[2] leases hash, KEYS[3] deadlines zset, KEYS[4] lease counter
-- ARGV[1] token prefix (the worker), ARGV[2] lease ms, ARGV[3] how many,
-- ARGV[4..] tokens to ack (their requests are queued)
-- Expired start leases (a worker died between taking and queueing) go back to
-- the head of the list first. Returns {token1, entry1, token2, entry2, ...}.
local prefix, lease_ms, want = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV do
  redis.call('ZREM', KEYS[3], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
for i = #expired, 1, -1 do
  local entry = redis.call('HGET', KEYS[2], expired[i])
  if entry then redis.call('LPUSH', KEYS[1], entry) end
  redis.call('HDEL', KEYS[2], expired[i])
  redis.call('ZREM', KEYS[3], expired[i])
end
local out = {}
for i = 1, want do
  local entry = redis.call('LPOP', KEYS[1])
  if not entry then break end
  local token = prefix .. redis.call('INCR', KEYS[4])
  redis.call('HSET', KEYS[2], token, entry)
  redis.call('ZADD', KEYS[3], now + lease_ms, token)
  out[#out + 1] = token
  out[#out + 1] = entry
end
return out
