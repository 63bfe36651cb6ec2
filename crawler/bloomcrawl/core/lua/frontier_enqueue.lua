-- One worker's exchange with one partition that sends requests: enqueue-if-new (the
-- Bloom check-and-set and the push into the hosts' queues in one atomic call, so no
-- crash leaves a request seen but not queued; a host that gets work and has a free
-- slot becomes ready), with what frontier_lease.lua does in the same call: what the
-- worker saw of hosts first, its finished leases and a lease after.
-- KEYS and ARGV[1..9] as frontier_lease.lua's (KEYS[1] is read: the filter's state),
-- KEYS[11] the partition's record of dont_filter entries queued (zset: key -> ms of
-- Redis TIME until which it is kept), then the feedback triples, the tokens to ack, and:
--   the fingerprints (20 bytes each; a dont_filter request's is its entry's own key, see
--   below), the flags, one per request: '0' filter it,
--   '1' dont_filter (queued without touching the filter), '-' record it in the filter
--   (the default window) but never queue it, a letter: filter it in that revisit
--   window; then score, host and payload of each request
-- returns {decisions, wait, token1, payload1, paced1, ...}: decisions has one '1' (queued), '2'
-- (queued again after its revisit window), '0' (duplicate) or '-' (recorded only) per
-- request; wait as frontier_lease.lua's
-- An exchange whose reply was lost is sent again, whole: its filtered requests are
-- duplicates the second time, and its dont_filter ones are found in KEYS[11] (kept
-- SENT_MS): queued once however often the exchange is sent. A dont_filter request made
-- again (a retry) is a new entry with a key of its own.
local SENT_MS = 600000
require_filter()  -- before the exchange's acks and feedback are written
return exchange(function(first)
  local flags = ARGV[first + 1]
  local sent_pruned = false
  local record = string.find(flags, '-', 1, true) and flags or nil
  if record then flags = (string.gsub(flags, '%-', '0')) end
  local keep = decide(ARGV[first], flags)
  local out, by_host, hosts = {}, {}, {}
  local base = first + 2
  for j = 0, #keep - 1 do
    local dont_filter = keep[j + 1] and string.byte(flags, j + 1) == 49
    if dont_filter and not sent_pruned then
      sent_pruned = true
      redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', PR.now)
    end
    if record and string.byte(record, j + 1) == 45 then
      out[j + 1] = '-'
    elseif dont_filter and redis.call('ZADD', KEYS[11], 'NX', PR.now + SENT_MS,
                                      string.sub(ARGV[first], 20 * j + 1, 20 * j + 20)) == 0 then
      out[j + 1] = '1'  -- queued by an earlier send of this exchange
    elseif keep[j + 1] then
      out[j + 1] = REVISITED and REVISITED[j + 1] and '2' or '1'
      local at = base + 3 * j
      local host = ARGV[at + 1]
      local list = by_host[host]
      if not list then
        list = {}
        by_host[host] = list
        hosts[#hosts + 1] = host
      end
      list[#list + 1] = ARGV[at]
      list[#list + 1] = ARGV[at + 2]
    else
      out[j + 1] = '0'
    end
  end
  for _, host in ipairs(hosts) do
    hq_push_all(host, by_host[host])
    make_ready(host)
  end
  return table.concat(out)
end)
