-- Add the partitions' requeued counters (frontier_reap.lua) to the shared stats by what
-- each grew since it was last added: however often a value is sent, by whichever worker,
-- each requeued lease is counted once.
-- KEYS[1] stats hash, KEYS[2] hash counter key -> "<epoch>:<n>" last added
-- ARGV: counter key, epoch, n, counter key, epoch, n, ...
-- A counter of another epoch than the one last added was made again since (its key
-- lost with its master, deleted by a flush or a clear): all of its n is new. Of the same
-- epoch, a value at or below the last one added is old news (another worker added a
-- later one first).
-- Returns how many were added.
local added = 0
for i = 1, #ARGV, 3 do
  local epoch, n = ARGV[i + 1], tonumber(ARGV[i + 2])
  local last = redis.call('HGET', KEYS[2], ARGV[i])
  local from = 0
  if last then
    local was, count = string.match(last, '^(.*):(%d+)$')
    if was == epoch then from = tonumber(count) end
  end
  if n > from then
    redis.call('HINCRBY', KEYS[1], 'requeued', n - from)
    redis.call('HSET', KEYS[2], ARGV[i], epoch .. ':' .. n)
    added = added + n - from
  end
end
return added
