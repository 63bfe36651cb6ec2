-- Move up to ARGV[3] requests of a partition's queue of before per-host queues into
-- their hosts' queues. KEYS[1] the old queue, KEYS[2..7] politeness (polite_common)
-- ARGV[1] cfg, ARGV[2] queue type. Returns how many were moved.
polite_init(2, ARGV[1])
PR.qtype = ARGV[2]
local most, n, touched = tonumber(ARGV[3]), 0, {}
while n < most do
  local payload, score
  if PR.qtype == 'priority' then
    local r = redis.call('ZPOPMIN', KEYS[1])
    payload, score = r[1], r[2]
  else
    payload, score = redis.call('LPOP', KEYS[1]), '0'
  end
  if not payload then break end
  local host = payload_host(payload)
  hq_push(host, score, payload, false)
  touched[host] = true
  n = n + 1
end
for host in pairs(touched) do make_ready(host) end
return n
