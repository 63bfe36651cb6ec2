-- Put expired leases back into the queue. KEYS[1] queue, KEYS[2] leases, KEYS[3] deadlines
-- ARGV[1] queue type, ARGV[2] most to requeue. Returns how many were requeued.
local qtype, most = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, most)
local n = 0
for _, token in ipairs(expired) do
  local v = redis.call('HGET', KEYS[2], token)
  if v then
    local bar = string.find(v, '|', 1, true)
    local score, payload = string.sub(v, 1, bar - 1), string.sub(v, bar + 1)
    if qtype == 'priority' then
      redis.call('ZADD', KEYS[1], score, payload)
    elseif qtype == 'fifo' then
      redis.call('LPUSH', KEYS[1], payload)  -- back at the head: it was due first
    else
      redis.call('RPUSH', KEYS[1], payload)
    end
    n = n + 1
  end
  redis.call('HDEL', KEYS[2], token)
  redis.call('ZREM', KEYS[3], token)
end
return n
