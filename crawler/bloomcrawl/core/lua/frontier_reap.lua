-- Put expired leases back into their hosts' queues and free the hosts' slots; forget
-- next-lease times already past; rebuild a lost ready set. KEYS[1] leases, KEYS[2] deadlines,
-- KEYS[3..8] politeness (polite_common), KEYS[9] the partition's requeued counter (a hash:
-- 'epoch', set when the counter is made, and 'n')
-- ARGV[1] politeness cfg, ARGV[2] queue type, ARGV[3] most to requeue, ARGV[4] the
-- worker's token: a counter made by this call gets the epoch "<Redis TIME>-<token>", new
-- each time one is made.
-- Returns {how many were requeued, the counter's epoch, its n} (epoch '' and n 0: no
-- counter yet): what this call requeued is counted here, in the same step, so a reply
-- lost on its way (a socket timeout, a closed connection) loses no count: the next
-- reap's reply carries it (frontier_requeued.lua).
polite_init(3, ARGV[1])
PR.qtype = ARGV[2]
local most = tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', PR.now, 'LIMIT', 0, most)
local n = 0
for _, token in ipairs(expired) do
  local v = redis.call('HGET', KEYS[1], token)
  redis.call('HDEL', KEYS[1], token)
  redis.call('ZREM', KEYS[2], token)
  if v then
    local host, score, payload = lease_host(v, true)
    local counted = host ~= nil
    if not counted then  -- a lease of before per-host queues
      local bar = string.find(v, '|', 1, true)
      score, payload = string.sub(v, 1, bar - 1), string.sub(v, bar + 1)
      host = payload_host(payload)
    end
    -- fifo: back at the head, it was due first; lifo: back on top
    hq_push(host, score, payload, PR.qtype == 'fifo')
    if counted then unbusy(host) else make_ready(host) end
    n = n + 1
  end
end
redis.call('ZREMRANGEBYSCORE', PR.next, '-inf', PR.now)
-- the ready set lost (a deleted key, a partial restore) while hosts have queued requests:
-- without it nothing would ever be leased again; every host with a free slot goes back
if redis.call('ZCARD', PR.ready) == 0 and redis.call('ZCARD', PR.depth) > 0 then
  for _, host in ipairs(redis.call('ZRANGE', PR.depth, 0, 9999)) do make_ready(host) end
end
if n > 0 then
  if redis.call('EXISTS', KEYS[9]) == 0 then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[9], 'epoch', t[1] .. '.' .. t[2] .. '-' .. ARGV[4])
  end
  redis.call('HINCRBY', KEYS[9], 'n', n)
end
local counter = redis.call('HMGET', KEYS[9], 'epoch', 'n')
return {n, counter[1] or '', tonumber(counter[2]) or 0}
