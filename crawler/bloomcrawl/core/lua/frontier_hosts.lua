-- Hosts of one partition, for the exporter and `bloomcrawl throttle`.
-- KEYS[1..6] politeness (polite_common); ARGV[1] cfg, ARGV[2] top k, ARGV[3..] hosts
-- (none: the partition's busiest k by queued requests, plus those in flight, up to k)
-- returns {hosts queued, requests queued, held back, in flight,
--          host, queued, in flight, delay ms, concurrency, ms until ready (-1: not timed), ...}
-- held back: queued requests of hosts that may not be leased now (bounded: the hosts
-- ready now are counted up to 10,000)
polite_init(1, ARGV[1])
local k = tonumber(ARGV[2])
local hosts = {}
if #ARGV > 2 then
  for i = 3, #ARGV do hosts[#hosts + 1] = ARGV[i] end
elseif k > 0 then
  local seen = {}
  for _, h in ipairs(redis.call('ZREVRANGE', PR.depth, 0, k - 1)) do
    seen[h] = true; hosts[#hosts + 1] = h
  end
  local busy = redis.call('HSCAN', PR.busy, 0, 'COUNT', k)
  for i = 1, #busy[2], 2 do
    local h = busy[2][i]
    if not seen[h] and #hosts < 2 * k then seen[h] = true; hosts[#hosts + 1] = h end
  end
end
local queued = tonumber(redis.call('GET', PR.queued) or '0')
local ready_now = redis.call('ZRANGEBYSCORE', PR.ready, '-inf', PR.now, 'LIMIT', 0, 10000)
local free = 0
for _, h in ipairs(ready_now) do
  free = free + tonumber(redis.call('ZSCORE', PR.depth, h) or '0')
end
local flight = 0
for _, n in ipairs(redis.call('HVALS', PR.busy)) do flight = flight + tonumber(n) end
local out = {redis.call('ZCARD', PR.depth), queued, math.max(0, queued - free), flight}
for _, h in ipairs(hosts) do
  local delay, conc = host_policy(h)
  local at = redis.call('ZSCORE', PR.ready, h)
  out[#out + 1] = h
  out[#out + 1] = tonumber(redis.call('ZSCORE', PR.depth, h) or '0')
  out[#out + 1] = tonumber(redis.call('HGET', PR.busy, h) or '0')
  out[#out + 1] = delay
  out[#out + 1] = conc
  out[#out + 1] = at and math.max(0, tonumber(at) - PR.now) or -1
end
return out
