-- Ack this worker's finished leases in the partition, then lease up to `want`
-- requests from hosts that may be fetched now: each host at most once per its
-- delay and never beyond its concurrency, cluster-wide. A leased request moves
-- from its host's queue into the lease hash (value "score|host|payload") with
-- a deadline from Redis's clock.
-- KEYS[1] leases hash, KEYS[2] deadlines zset, KEYS[3] lease counter,
-- KEYS[4..9] politeness (polite_common)
-- ARGV[1] queue type, ARGV[2] lease ms, ARGV[3] how many, ARGV[4] token prefix (the worker),
-- ARGV[5] politeness cfg, ARGV[6] a random number in [0, 1) (the delay jitter),
-- ARGV[7..] tokens to ack first
-- returns {wait, token1, payload1, token2, payload2, ...}: wait is the ms until the
-- partition's next host is ready (-1: nothing queued; -2: requests queued, but every
-- host that has some is at its concurrency: ready again when a slot frees)
--
-- Tokens are numbered by Redis (KEYS[3]), never by the client: a call sent
-- twice (a reply lost, redis-py retrying) leases a second batch under new
-- tokens instead of overwriting the first batch's leases, which expire and
-- go back to the queue. Nothing is lost either way.
polite_init(4, ARGV[5])
PR.qtype = ARGV[1]
local lease_ms, want, prefix = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local u = tonumber(ARGV[6])
for i = 7, #ARGV do
  end_lease(KEYS[1], KEYS[2], ARGV[i])
end
local out = {'-1'}
local n = 0
while n < want do
  local r = redis.call('ZRANGEBYSCORE', PR.ready, '-inf', PR.now, 'LIMIT', 0, 1)
  if #r == 0 then break end
  local host = r[1]
  local payload, score = hq_pop(host)
  if not payload then
    redis.call('ZREM', PR.ready, host)
  else
    local delay, conc, hold = host_policy(host)
    if PR.jitter > 0 and delay > 0 then
      u = (u + 0.6180339887) % 1
      delay = delay * (1 + PR.jitter * (2 * u - 1))
    end
    local at = math.max(PR.now + math.floor(delay * PR.margin), hold)
    redis.call('ZADD', PR.next, at, host)
    if redis.call('HINCRBY', PR.busy, host, 1) >= conc
        or not redis.call('ZSCORE', PR.depth, host) then
      redis.call('ZREM', PR.ready, host)
    else
      redis.call('ZADD', PR.ready, at, host)
    end
    local token = prefix .. redis.call('INCR', KEYS[3])
    redis.call('HSET', KEYS[1], token, score .. '|' .. host .. '|' .. payload)
    redis.call('ZADD', KEYS[2], PR.now + lease_ms, token)
    out[#out + 1] = token
    out[#out + 1] = payload
    n = n + 1
  end
end
local first = redis.call('ZRANGE', PR.ready, 0, 0, 'WITHSCORES')
if #first > 0 then
  out[1] = tostring(math.max(0, tonumber(first[2]) - PR.now))
elseif tonumber(redis.call('GET', PR.queued) or '0') > 0 then
  out[1] = '-2'  -- requests queued, every host with them at its concurrency
end
return out
