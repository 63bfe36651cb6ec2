-- Add each partition's requeued counter (frontier_reap.lua) to the shared stats by what
-- it grew since it was last added: however often a value is sent, by whichever worker,
-- each requeued lease is counted once. A value at or below the last one added is old
-- news (another worker added a later one first).
-- KEYS[1] stats hash, KEYS[2] hash partition -> the counter's value last added
-- ARGV: partition, counter, partition, counter, ...
-- Returns how many were added.
local added = 0
for i = 1, #ARGV, 2 do
  local counter = tonumber(ARGV[i + 1])
  local last = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
  if counter > last then
    redis.call('HINCRBY', KEYS[1], 'requeued', counter - last)
    redis.call('HSET', KEYS[2], ARGV[i], counter)
    added = added + counter - last
  end
end
return added
