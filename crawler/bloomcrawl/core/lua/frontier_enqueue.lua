-- Enqueue-if-new for one partition: the Bloom check-and-set and the push into the
-- hosts' queues in one atomic call, so no crash leaves a request seen but not queued.
-- A host that gets work and has a free slot becomes ready.
-- KEYS[1] filter partition state, KEYS[2..7] politeness (polite_common)
-- ARGV[1] fingerprints (20 bytes each)   ARGV[2] flags, one per request:
--   '0' filter it, '1' dont_filter (queued without touching the filter)
-- ARGV[3] queue type: priority | fifo | lifo, ARGV[4] politeness cfg
-- ARGV[5 + 3j], ARGV[6 + 3j], ARGV[7 + 3j]: score, host and payload of request j
-- returns one '1' (queued) or '0' (duplicate) per request
local blob, flags = ARGV[1], ARGV[2]
polite_init(2, ARGV[4])
PR.qtype = ARGV[3]
local keep = decide(blob, flags)
local out, touched = {}, {}
for j = 0, #keep - 1 do
  if keep[j + 1] then
    out[j + 1] = '1'
    local host = ARGV[6 + 3 * j]
    hq_push(host, ARGV[5 + 3 * j], ARGV[7 + 3 * j], false)
    touched[host] = true
  else
    out[j + 1] = '0'
  end
end
for host in pairs(touched) do
  make_ready(host)
end
return table.concat(out)
