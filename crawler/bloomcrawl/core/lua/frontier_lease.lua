-- Ack this worker's finished leases in the partition, then lease up to ARGV[3]
-- requests from it: each moves from the queue into the lease hash (value
-- "score|payload") with a deadline from Redis's clock.
-- KEYS[1] queue, KEYS[2] leases hash, KEYS[3] deadlines zset, KEYS[4] lease counter
-- ARGV[1] queue type, ARGV[2] lease ms, ARGV[3] how many, ARGV[4] token prefix (the worker),
-- ARGV[5..] tokens to ack first (only the holder's own tokens match)
-- returns {token1, payload1, token2, payload2, ...}
--
-- Tokens are numbered by Redis (KEYS[4]), never by the client: a call sent
-- twice (a reply lost, redis-py retrying) leases a second batch under new
-- tokens instead of overwriting the first batch's leases, which expire and
-- go back to the queue. Nothing is lost either way.
local qtype, lease_ms, want, prefix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for i = 5, #ARGV do
  redis.call('ZREM', KEYS[3], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, want do
  local payload, score
  if qtype == 'priority' then
    local r = redis.call('ZPOPMIN', KEYS[1])
    payload, score = r[1], r[2]
  elseif qtype == 'fifo' then
    payload, score = redis.call('LPOP', KEYS[1]), '0'
  else
    payload, score = redis.call('RPOP', KEYS[1]), '0'
  end
  if not payload then break end
  local token = prefix .. redis.call('INCR', KEYS[4])
  redis.call('HSET', KEYS[2], token, score .. '|' .. payload)
  redis.call('ZADD', KEYS[3], now + lease_ms, token)
  out[#out + 1] = token
  out[#out + 1] = payload
end
return out
