-- Enqueue-if-new for one partition: the Bloom check-and-set and the push into
-- the queue in one atomic call, so no crash leaves a request seen but not queued.
-- KEYS[1] filter partition state, KEYS[2] queue partition
-- ARGV[1] fingerprints (20 bytes each)   ARGV[2] flags, one per request:
--   '0' filter it, '1' dont_filter (queued without touching the filter)
-- ARGV[3] queue type: priority | fifo | lifo
-- ARGV[4 + 2j], ARGV[5 + 2j]: score and payload of request j
-- returns one '1' (queued) or '0' (duplicate) per request
local blob, flags, qtype, queue = ARGV[1], ARGV[2], ARGV[3], KEYS[2]
local keep = decide(blob, flags)
local out, push, np = {}, {}, 0
for j = 0, #keep - 1 do
  if keep[j + 1] then
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
return table.concat(out)
