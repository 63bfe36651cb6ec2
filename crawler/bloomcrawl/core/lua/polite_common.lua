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
-- constant numbers the exchange's calls pass to Redis are written as strings ('0'): Redis
-- formats each number argument with %.17g, about 0.1 us each

local function polite_init(base, cfg)
  PR.ready, PR.depth, PR.busy = KEYS[base], KEYS[base + 1], KEYS[base + 2]
  PR.next, PR.policy, PR.queued = KEYS[base + 3], KEYS[base + 4], KEYS[base + 5]
  local d, c, j, st, prefix = string.match(cfg, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  PR.delay, PR.conc, PR.jitter, PR.hq = tonumber(d), tonumber(c), tonumber(j), prefix
  PR.start = tonumber(st)
  PR.pol = {}
  local t = redis.call('TIME')
  PR.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- delay (ms, before jitter), concurrency and back-off end (ms) of a host; read once per
-- call (PR.pol), so whatever writes a policy field first clears PR.pol
local function host_policy(host)
  local p = PR.pol[host]
  if p then return p[1], p[2], p[3] end
  local v = redis.call('HMGET', PR.policy, 'delay:' .. host, 'conc:' .. host,
                       'sdelay:' .. host, 'sconc:' .. host, 'robots:' .. host,
                       'auto:' .. host, 'until:' .. host)
  local delay = tonumber(v[1]) or tonumber(v[3]) or PR.delay
  local conc = tonumber(v[2]) or tonumber(v[4]) or PR.conc
  -- AutoThrottle: a host it has not adapted yet starts at AUTOTHROTTLE_START_DELAY
  delay = math.max(delay, tonumber(v[5]) or 0, tonumber(v[6]) or PR.start)
  conc = math.max(conc, 1)
  local hold = tonumber(v[7]) or 0
  PR.pol[host] = {delay, conc, hold}
  return delay, conc, hold
end

-- the host a lease value "score|host|payload" is for; nil for a value of before
-- per-host queues ("score|payload"): it was never counted as in flight. With `whole`,
-- its score and payload too (each string a script makes is hashed byte by byte: an ack
-- needs the host alone)
local function lease_host(v, whole)
  local bar = string.find(v, '|', 1, true)
  if string.byte(v, bar + 1) == 123 then return nil end  -- '{': a payload
  local bar2 = string.find(v, '|', bar + 1, true)
  if not whole then return string.sub(v, bar + 1, bar2 - 1) end
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
    redis.call('ZINCRBY', PR.depth, '1', host)
    redis.call('INCR', PR.queued)
  end
  return added
end

-- the most arguments one command of a script gets from unpack()
local SPREAD = 1000

-- push requests at the back of a host's queue, in order: list {score1, payload1, ...};
-- one command for the queue, one for the depth, one for the partition's count
local function hq_push_all(host, list)
  local q, added = PR.hq .. host, 0
  for s = 1, #list, SPREAD do
    local e = math.min(#list, s + SPREAD - 1)
    if PR.qtype == 'priority' then
      added = added + redis.call('ZADD', q, unpack(list, s, e))
    else
      local payloads = {}
      for i = s + 1, e, 2 do payloads[#payloads + 1] = list[i] end
      redis.call('RPUSH', q, unpack(payloads))
      added = added + #payloads
    end
  end
  if added > 0 then
    redis.call('ZINCRBY', PR.depth, added, host)
    redis.call('INCRBY', PR.queued, added)
  end
  return added
end

-- up to n of the host's next requests: {payload1, score1, ...} (empty when its queue is)
local function hq_pop(host, n)
  local q, got = PR.hq .. host, {}
  if PR.qtype == 'priority' then
    got = redis.call('ZPOPMIN', q, n)
  else
    local r = redis.call(PR.qtype == 'fifo' and 'LPOP' or 'RPOP', q, n)
    for _, payload in ipairs(r or {}) do
      got[#got + 1] = payload
      got[#got + 1] = '0'
    end
  end
  local count = #got / 2
  if count == 0 then
    redis.call('ZREM', PR.depth, host)
    return got
  end
  if tonumber(redis.call('ZINCRBY', PR.depth, -count, host)) <= 0 then
    redis.call('ZREM', PR.depth, host)
  end
  redis.call('INCRBY', PR.queued, -count)
  return got
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

-- n leases of the host ended (acked or expired): their slots are free again
local function unbusy(host, n)
  if redis.call('HINCRBY', PR.busy, host, -(n or 1)) <= 0 then
    redis.call('HDEL', PR.busy, host)
  end
  make_ready(host)
end

-- end the leases of ARGV[first..last]; returns how many were held (only the holder's own
-- token matches). An arg is a token, or "token|ms": the lease's response came back that
-- many ms ago. A host with one slot is then not leased again before that plus its
-- delay: its request reached the site before its response came back, however late it
-- left its worker. The leases' hosts are counted once each, whatever how many ended.
local function end_leases(leases, deadlines, first, last)
  if first > last then return 0 end
  local tokens, agos, dup = {}, {}, {}
  for i = first, last do
    local token, ago = string.match(ARGV[i], '^(.*)|(%d+)$')
    token = token or ARGV[i]
    if not dup[token] then  -- a token twice in one call ends one lease
      dup[token] = true
      tokens[#tokens + 1] = token
      agos[#tokens] = tonumber(ago) or false
    end
  end
  local held, ended, order = 0, {}, {}
  for s = 1, #tokens, SPREAD do
    local e = math.min(#tokens, s + SPREAD - 1)
    held = held + redis.call('ZREM', deadlines, unpack(tokens, s, e))
    local values = redis.call('HMGET', leases, unpack(tokens, s, e))
    redis.call('HDEL', leases, unpack(tokens, s, e))
    for j = s, e do
      local host = values[j - s + 1] and lease_host(values[j - s + 1])
      if host then
        local h = ended[host]
        if not h then
          h = {n = 0, ago = false}
          ended[host] = h
          order[#order + 1] = host
        end
        h.n = h.n + 1
        local ago = agos[j]
        if ago and (not h.ago or ago < h.ago) then h.ago = ago end
      end
    end
  end
  for _, host in ipairs(order) do
    local h = ended[host]
    if h.ago then
      local delay, conc = host_policy(host)
      local at = PR.now - h.ago + math.floor(delay * PR.margin)
      if conc == 1 and at > tonumber(redis.call('ZSCORE', PR.next, host) or '0') then
        redis.call('ZADD', PR.next, at, host)
      end
    end
    unbusy(host, h.n)
  end
  return held
end

-- What workers saw of hosts, the triples kind, host, value of ARGV[first..last]:
--   robots  <Crawl-delay ms>     ('0' clears it)
--   backoff <ms to hold the host from now>
--   latency "<latency ms>|<1: ok, 0: an error status>|<target concurrency>|<start ms>|<max ms>"
--   sent    <ms ago a request of the host went out>: its delay counts from then, so
--           the host's next lease is no earlier than that plus its delay (a leased
--           request may wait in a busy worker before it leaves)
-- AutoThrottle as Scrapy's: aim for latency / target concurrency, move halfway
-- there, never below the host's base delay nor above the max, and an error
-- response never shortens the delay.
local function apply_feedback(first, last)
  for i = first, last, 3 do
    local kind, host, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    if kind == 'robots' then
      if tonumber(value) > 0 then
        redis.call('HSET', PR.policy, 'robots:' .. host, value)
      else
        redis.call('HDEL', PR.policy, 'robots:' .. host)
      end
      PR.pol[host] = nil
    elseif kind == 'backoff' then
      local hold = PR.now + tonumber(value)
      if hold > tonumber(redis.call('HGET', PR.policy, 'until:' .. host) or '0') then
        redis.call('HSET', PR.policy, 'until:' .. host, hold)
        PR.pol[host] = nil
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
        PR.pol[host] = nil
      end
    end
  end
end

-- Lease up to `want` requests from hosts that may be fetched now: each host at most once
-- per its delay and never beyond its concurrency, cluster-wide. A leased request moves
-- from its host's queue into the lease hash (value "score|host|payload") with a deadline
-- from Redis's clock. Tokens are numbered by Redis (the counter), never by the client: a
-- call sent twice (a reply lost, redis-py retrying) leases a second batch under new
-- tokens instead of overwriting the first batch's leases, which expire and go back to
-- the queue. Nothing is lost either way.
-- A host without a delay that is the only one ready gives all it may at once (up to
-- its free slots) in one command each; with several ready, each gives one in turn.
-- Beyond `want`, up to `ahead` more come from hosts without a delay only, each giving
-- at most 1/share of its free slots (share 2: half): a worker keeps those for its
-- engine's next free slots (fewer exchanges); a request that waits in a worker cannot
-- break a delay its host does not have, and the host keeps slots for the other workers.
-- A worker alone in the crawl asks with share 1: there are no others to keep them for.
-- Within `want`, a host with a delay and one slot ready within `horizon` ms is leased for
-- then: the worker holds its request until that time (the lease says how long from now),
-- and the host's next lease counts from it. Workers that all learnt when a host is ready would
-- otherwise each ask at that moment, and all but one find nothing.
-- u: a random number in [0, 1) for the delay jitter. Appends token, payload, paced, ...
-- to out; paced is '0' for a host without a delay, else
-- '1:<delay ms>:<room ms>:<not before ms>': the delay (jitter applied), how long after
-- this lease's time the host's next one may come at the earliest (the delay and its
-- margin), and how long from now the request may not leave (0: at once). When the
-- request left matters to that next lease: a worker reports it when late by more than
-- the margin can absorb (from its time, not before). Room -1: a
-- host of one slot, whose next lease waits for this one's ack and counts from the end
-- it carries (end_leases), so when it left never needs reporting.
local function lease_ready(leases, deadlines, counter, want, ahead, horizon, lease_ms, prefix,
                           u, out, share)
  local n, most, spare = 0, want + ahead, {}
  while n < most do
    local r = redis.call('ZRANGEBYSCORE', PR.ready, '-inf', PR.now + horizon, 'WITHSCORES',
                         'LIMIT', '0', '2')
    if #r == 0 then break end
    local host, start = r[1], math.max(PR.now, tonumber(r[2]))
    local delay, conc, hold = host_policy(host)
    if delay > 0 and n >= want then break end
    -- a host ready later (within the horizon): only one with a delay and one slot is
    -- leased for its time. Its next lease waits for this one's ack and counts from the
    -- end the ack carries; a host of more slots could be leased again before a late send
    -- of this request, or a 429, were reported
    if start > PR.now and (delay == 0 or conc > 1) then break end
    -- another host ready now besides this one
    local several = #r > 2 and tonumber(r[4]) <= PR.now
    local take, need = 1, want - n
    if delay == 0 and (most - n > 1 or need <= 0) and (not several or need <= 0) then
      local free = conc - tonumber(redis.call('HGET', PR.busy, host) or '0')
      local due = math.max(0, math.min(need, free))
      -- ahead, at most 1/share of the free slots the host had when this call first
      -- took from it: requests held in a worker must not keep the others from its slots
      local left = spare[host] or math.floor((free - due) / share)
      -- several hosts ready (need <= 0 then): one each in turn
      local extra = math.max(0, math.min(left, several and 1 or most - n - due))
      spare[host] = left - extra
      take = due + extra
      if take < 1 then
        if need <= 0 then break end
        take = 1
      end
    end
    local got = hq_pop(host, take)
    local count = #got / 2
    if count == 0 then
      redis.call('ZREM', PR.ready, host)
    else
      if PR.jitter > 0 and delay > 0 then
        u = (u + 0.6180339887) % 1
        delay = delay * (1 + PR.jitter * (2 * u - 1))
      end
      local room = math.floor(delay * PR.margin)
      local paced = '0'
      if delay > 0 then
        paced = '1:' .. math.floor(delay) .. ':' .. (conc == 1 and -1 or room) .. ':'
                .. (start - PR.now)
      end
      local at = math.max(start + room, hold)
      redis.call('ZADD', PR.next, at, host)
      if redis.call('HINCRBY', PR.busy, host, count) >= conc
          or not redis.call('ZSCORE', PR.depth, host) then
        redis.call('ZREM', PR.ready, host)
      else
        redis.call('ZADD', PR.ready, at, host)
      end
      local last = redis.call('INCRBY', counter, count)
      local values, deadline, expiry = {}, {}, start + lease_ms
      for i = 1, count do
        local token = prefix .. (last - count + i)
        local payload = got[2 * i - 1]
        values[2 * i - 1] = token
        values[2 * i] = got[2 * i] .. '|' .. host .. '|' .. payload
        deadline[2 * i - 1] = expiry
        deadline[2 * i] = token
        out[#out + 1] = token
        out[#out + 1] = payload
        out[#out + 1] = paced
      end
      redis.call('HSET', leases, unpack(values))
      redis.call('ZADD', deadlines, unpack(deadline))
      n = n + count
    end
  end
end

-- ms until the partition's next host is ready: -1 nothing queued, -2 requests queued but
-- every host with some is at its concurrency (ready again when a slot frees)
local function ready_wait()
  local first = redis.call('ZRANGE', PR.ready, '0', '0', 'WITHSCORES')
  if #first > 0 then
    return tostring(math.max(0, tonumber(first[2]) - PR.now))
  elseif tonumber(redis.call('GET', PR.queued) or '0') > 0 then
    return '-2'
  end
  return '-1'
end

-- One worker's exchange with one partition, in this order: what it saw of hosts (it may
-- hold them back), its new requests (enqueue(first arg) when given: the decisions, one
-- '1' or '0' per request), its finished leases, then a lease of up to `want` requests.
-- KEYS[1] filter partition state, KEYS[2] leases, KEYS[3] deadlines, KEYS[4] lease
-- counter, KEYS[5..10] politeness (polite_init)
-- ARGV[1] cfg, ARGV[2] queue type, ARGV[3] feedback triples, ARGV[4] acks, ARGV[5] want,
-- ARGV[6] lease ms, ARGV[7] token prefix (the worker), ARGV[8] a random number in [0, 1),
-- ARGV[9] ahead:horizon:share (lease_ready), then the feedback triples, the acks, and what
-- enqueue reads.
-- Returns {decisions, wait, token1, payload1, paced1, ...}; wait as ready_wait(), after
-- all of it (acks and new requests may have made a host ready, or set when it is).
local function exchange(enqueue)
  polite_init(5, ARGV[1])
  PR.qtype = ARGV[2]
  local feedback, acks, want = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local at = 10
  apply_feedback(at, at + 3 * feedback - 1)
  at = at + 3 * feedback
  local ack_from = at
  at = at + acks
  local out = {enqueue and enqueue(at) or '', ''}
  end_leases(KEYS[2], KEYS[3], ack_from, at - 1)
  -- ARGV[9]: "<ahead>:<horizon ms>:<share>"
  local ahead, horizon, share = string.match(ARGV[9], '^(%d+):(%d+):(%d+)$')
  ahead = tonumber(ahead)
  if want > 0 or ahead > 0 then
    lease_ready(KEYS[2], KEYS[3], KEYS[4], want, ahead, tonumber(horizon),
                tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]), out, tonumber(share))
  end
  out[2] = ready_wait()
  return out
end
