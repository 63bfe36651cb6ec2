-- What workers saw of hosts: robots.txt Crawl-delay, a back-off after 429/503, and
-- response latencies (AutoThrottle, adapted from every worker's responses).
-- KEYS[1..6] politeness (polite_common); ARGV[1] cfg, then triples kind, host, value:
--   robots  <Crawl-delay ms>     ('0' clears it)
--   backoff <ms to hold the host from now>
--   latency "<latency ms>|<1: ok, 0: an error status>|<target concurrency>|<start ms>|<max ms>"
--   sent    <ms ago a request of the host went out>: its delay counts from then, so
--           the host's next lease is no earlier than that plus its delay (a leased
--           request may wait in a busy worker before it leaves)
-- AutoThrottle as Scrapy's: aim for latency / target concurrency, move halfway
-- there, never below the host's base delay nor above the max, and an error
-- response never shortens the delay.
polite_init(1, ARGV[1])
for i = 2, #ARGV, 3 do
  local kind, host, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if kind == 'robots' then
    if tonumber(value) > 0 then
      redis.call('HSET', PR.policy, 'robots:' .. host, value)
    else
      redis.call('HDEL', PR.policy, 'robots:' .. host)
    end
  elseif kind == 'backoff' then
    local hold = PR.now + tonumber(value)
    if hold > tonumber(redis.call('HGET', PR.policy, 'until:' .. host) or '0') then
      redis.call('HSET', PR.policy, 'until:' .. host, hold)
    end
    local at = redis.call('ZSCORE', PR.ready, host)
    if at and tonumber(at) < hold then redis.call('ZADD', PR.ready, hold, host) end
    if tonumber(redis.call('ZSCORE', PR.next, host) or '0') < hold then
      redis.call('ZADD', PR.next, hold, host)
    end
  elseif kind == 'sent' then
    local delay = host_policy(host)
    local at = PR.now - tonumber(value) + math.floor(delay * PR.margin)
    if at > PR.now then
      if at > tonumber(redis.call('ZSCORE', PR.next, host) or '0') then
        redis.call('ZADD', PR.next, at, host)
      end
      local r = redis.call('ZSCORE', PR.ready, host)
      if r and tonumber(r) < at then redis.call('ZADD', PR.ready, at, host) end
    end
  elseif kind == 'latency' then
    local lat, ok, target, start, most = string.match(value,
        '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    lat, target, start, most = tonumber(lat), tonumber(target), tonumber(start), tonumber(most)
    local v = redis.call('HMGET', PR.policy, 'delay:' .. host, 'sdelay:' .. host,
                         'auto:' .. host)
    local base = tonumber(v[1]) or tonumber(v[2]) or PR.delay
    local cur = tonumber(v[3]) or math.max(start, base)
    local aim = lat / target
    local new = math.max(aim, (cur + aim) / 2)
    new = math.min(math.max(base, new), math.max(most, base))
    if ok == '1' or new > cur then
      redis.call('HSET', PR.policy, 'auto:' .. host, math.floor(new))
    end
  end
end
return 1
