-- Enqueue-if-new for one partition: the Bloom check-and-set and the push into
-- the queue in one atomic call, so no crash leaves a request seen but not queued.
-- KEYS[1] filter partition state, KEYS[2] queue partition
-- ARGV[1] fingerprints (20 bytes each)   ARGV[2] flags, one per request:
--   '0' filter it, '1' dont_filter (queued without touching the filter)
-- ARGV[3] queue type: priority | fifo | lifo
-- ARGV[4 + 2j], ARGV[5 + 2j]: score and payload of request j
-- returns one '1' (queued) or '0' (duplicate) per request
local blob, flags, qtype, queue = ARGV[1], ARGV[2], ARGV[3], KEYS[2]
local count = #blob / 20
local first_slices = nslices
local out, push, np = {}, {}, 0
local checked, filtered = 0, 0
for j = 0, count - 1 do
  local keep = true
  if byte(flags, j + 1) ~= 49 then
    checked = checked + 1
    local h1, h2, h3, h4 = hashes(blob, j * 20)
    keep = add_item(h1, h2, h3, h4)
    if not keep then filtered = filtered + 1 end
  end
  if keep then
    out[j + 1] = '1'
    if qtype == 'priority' then
      push[np + 1] = ARGV[4 + 2 * j]; push[np + 2] = ARGV[5 + 2 * j]; np = np + 2
    else
      np = np + 1; push[np] = ARGV[5 + 2 * j]
    end
  else
    out[j + 1] = '0'
  end
end
local CH = 6000
for s = 1, np, CH do
  local e = math.min(s + CH - 1, np)
  if qtype == 'priority' then
    redis.call('ZADD', queue, unpack(push, s, e))
  else
    redis.call('RPUSH', queue, unpack(push, s, e))
  end
end
save_counters(first_slices, checked, filtered)
return table.concat(out)
