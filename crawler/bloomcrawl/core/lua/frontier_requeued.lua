-- Add the partitions' requeued counters (frontier_reap.lua) to the shared stats by what
-- each grew since it was last added: however often a value is sent, by whichever worker,
-- in whatever order, each requeued lease is counted once.
-- KEYS[1] stats hash, KEYS[2] hash "<counter key>|<epoch>" -> the n last added
-- ARGV: counter key, epoch, n, counter key, epoch, n, ...
-- Each life of a counter (an epoch: made again after its key was lost with its master,
-- deleted by a flush or a clear) is counted on its own from 0; of one life, a value at
-- or below the last one added is old news (another worker added a later one first).
-- Returns how many were added.
local added = 0
for i = 1, #ARGV, 3 do
  local field, n = ARGV[i] .. '|' .. ARGV[i + 1], tonumber(ARGV[i + 2])
  local last = tonumber(redis.call('HGET', KEYS[2], field) or '0')
  if n > last then
    redis.call('HINCRBY', KEYS[1], 'requeued', n - last)
    redis.call('HSET', KEYS[2], field, n)
    added = added + n - last
  end
end
return added
