-- Set or clear a host's delay and concurrency override, effective from its next lease.
-- KEYS[1..6] politeness (polite_common)
-- ARGV[1] cfg, ARGV[2] source: '' the operator's, 's' the DOWNLOAD_SLOTS setting's,
-- ARGV[3] host, ARGV[4] delay ms, ARGV[5] concurrency ('' leaves it, '-' clears it)
-- Returns {delay ms, concurrency} now in force for the host.
polite_init(1, ARGV[1])
local src, host = ARGV[2], ARGV[3]
local fields = {{src .. 'delay:' .. host, ARGV[4]}, {src .. 'conc:' .. host, ARGV[5]}}
for _, f in ipairs(fields) do
  if f[2] == '-' then
    redis.call('HDEL', PR.policy, f[1])
  elseif f[2] ~= '' then
    redis.call('HSET', PR.policy, f[1], f[2])
  end
end
local delay, conc, hold = host_policy(host)
-- more concurrency may free a slot at once; a shorter delay counts from now
make_ready(host)
local soonest = math.max(PR.now + delay, hold)
if tonumber(redis.call('ZSCORE', PR.next, host) or '0') > soonest then
  redis.call('ZADD', PR.next, soonest, host)
end
local at = redis.call('ZSCORE', PR.ready, host)
if at and tonumber(at) > soonest then
  redis.call('ZADD', PR.ready, soonest, host)
end
return {delay, conc}
