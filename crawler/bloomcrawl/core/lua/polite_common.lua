-- Per-host politeness of one partition (prelude). Every key of a partition shares its
-- hash tag, so the host queues (PR.hq .. host) live in the caller's slot.
-- polite_init(base, cfg): KEYS[base..base+5] = ready, depth, busy, next, policy, queued;
-- cfg = "<default delay ms>|<default concurrency>|<jitter>|<AutoThrottle start ms, -1: off>|
--        <host queue prefix>".
--   ready   zset host -> ms from when it may be leased: the hosts with queued requests
--           and a free slot, nothing else
--   depth   zset host -> requests queued       busy  hash host -> requests leased
--   next    zset host -> ms of its next allowed lease (last lease + delay)
--   policy  hash delay:/conc: (operator), sdelay:/sconc: (DOWNLOAD_SLOTS),
--           robots: (Crawl-delay), auto: (AutoThrottle), until: (back-off end), in ms
--   queued  string: requests queued in the partition
local PR = {}
-- a host's delay is kept this much longer: a request can leave its worker some ms
-- after its lease (a busy or descheduled process), its successor on time
PR.margin = 1.05

local function polite_init(base, cfg)
  PR.ready, PR.depth, PR.busy = KEYS[base], KEYS[base + 1], KEYS[base + 2]
  PR.next, PR.policy, PR.queued = KEYS[base + 3], KEYS[base + 4], KEYS[base + 5]
  local d, c, j, st, prefix = string.match(cfg, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  PR.delay, PR.conc, PR.jitter, PR.hq = tonumber(d), tonumber(c), tonumber(j), prefix
  PR.start = tonumber(st)
  local t = redis.call('TIME')
  PR.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- delay (ms, before jitter), concurrency and back-off end (ms) of a host
local function host_policy(host)
  local v = redis.call('HMGET', PR.policy, 'delay:' .. host, 'conc:' .. host,
                       'sdelay:' .. host, 'sconc:' .. host, 'robots:' .. host,
                       'auto:' .. host, 'until:' .. host)
  local delay = tonumber(v[1]) or tonumber(v[3]) or PR.delay
  local conc = tonumber(v[2]) or tonumber(v[4]) or PR.conc
  -- AutoThrottle: a host it has not adapted yet starts at AUTOTHROTTLE_START_DELAY
  delay = math.max(delay, tonumber(v[5]) or 0, tonumber(v[6]) or PR.start)
  return delay, math.max(conc, 1), tonumber(v[7]) or 0
end

-- the host a lease value "score|host|payload" is for; nil for a value of before
-- per-host queues ("score|payload"): it was never counted as in flight
local function lease_host(v)
  local bar = string.find(v, '|', 1, true)
  if string.sub(v, bar + 1, bar + 1) == '{' then return nil end
  local bar2 = string.find(v, '|', bar + 1, true)
  return string.sub(v, bar + 1, bar2 - 1), string.sub(v, 1, bar - 1), string.sub(v, bar2 + 1)
end

-- the host of a serialized request (what Python's urlsplit(url).hostname gives)
local function payload_host(payload)
  local ok, data = pcall(cjson.decode, payload)
  local url = ok and type(data) == 'table' and data.url or ''
  if type(url) ~= 'string' then url = '' end
  local auth = string.match(url, '^%a[%w+.-]*://([^/?#]*)') or ''
  auth = string.match(auth, '^.*@(.*)$') or auth
  local host = string.match(auth, '^%[([^%]]*)%]') or string.match(auth, '^([^:]*)') or ''
  return (string.gsub(string.gsub(string.lower(host), '|', '%%7C'), ' ', '%%20'))
end

-- push a request into its host's queue; returns 1 when it was added
local function hq_push(host, score, payload, front)
  local q, added = PR.hq .. host, 1
  if PR.qtype == 'priority' then
    added = redis.call('ZADD', q, score, payload)
  elseif front then
    redis.call('LPUSH', q, payload)
  else
    redis.call('RPUSH', q, payload)
  end
  if added == 1 then
    redis.call('ZINCRBY', PR.depth, 1, host)
    redis.call('INCR', PR.queued)
  end
  return added
end

-- the host's next request: payload, score (nil when its queue is empty)
local function hq_pop(host)
  local q, payload, score = PR.hq .. host, nil, '0'
  if PR.qtype == 'priority' then
    local r = redis.call('ZPOPMIN', q)
    payload, score = r[1], r[2]
  elseif PR.qtype == 'fifo' then
    payload = redis.call('LPOP', q)
  else
    payload = redis.call('RPOP', q)
  end
  if not payload then
    redis.call('ZREM', PR.depth, host)
    return nil
  end
  if tonumber(redis.call('ZINCRBY', PR.depth, -1, host)) <= 0 then
    redis.call('ZREM', PR.depth, host)
  end
  redis.call('DECR', PR.queued)
  return payload, score
end

-- a host with queued requests and a free slot belongs in ready, at its next allowed time
local function make_ready(host)
  if redis.call('ZSCORE', PR.ready, host) or not redis.call('ZSCORE', PR.depth, host) then
    return
  end
  local busy = tonumber(redis.call('HGET', PR.busy, host) or '0')
  if busy > 0 then
    local _, conc = host_policy(host)
    if busy >= conc then return end
  end
  redis.call('ZADD', PR.ready, tonumber(redis.call('ZSCORE', PR.next, host) or '0'), host)
end

-- a lease of the host ended (acked or expired): its slot is free again
local function unbusy(host)
  if redis.call('HINCRBY', PR.busy, host, -1) <= 0 then
    redis.call('HDEL', PR.busy, host)
  end
  make_ready(host)
end

-- end a lease: 1 when the token was held (only the holder's own token matches).
-- arg: the token, or "token|ms": the lease's response came back that many ms ago. A
-- host with one slot is then not leased again before that plus its delay: its request
-- reached the site before its response came back, however late it left its worker.
local function end_lease(leases, deadlines, arg)
  local token, ago = string.match(arg, '^(.*)|(%d+)$')
  token = token or arg
  local held = redis.call('ZREM', deadlines, token)
  local v = redis.call('HGET', leases, token)
  redis.call('HDEL', leases, token)
  if v then
    local host = lease_host(v)
    if host then
      if ago then
        local delay, conc = host_policy(host)
        local at = PR.now - tonumber(ago) + math.floor(delay * PR.margin)
        if conc == 1 and at > tonumber(redis.call('ZSCORE', PR.next, host) or '0') then
          redis.call('ZADD', PR.next, at, host)
        end
      end
      unbusy(host)
    end
  end
  return held
end
