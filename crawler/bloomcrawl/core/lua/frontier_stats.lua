-- Add one exchange's counts to the shared stats, once however often it is sent.
-- KEYS[1] stats hash, KEYS[2] pages-by-node hash, KEYS[3] hash worker -> last applied number
-- ARGV[1] worker, ARGV[2] the exchange's number (a worker numbers them 1, 2, 3, ...),
-- ARGV[3] the worker's host name, ARGV[4..] field, increment, field, increment, ...
-- Returns 1 when applied, 0 when this number was applied already.
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local seq = tonumber(ARGV[2])
if seq <= last then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], seq)
for i = 4, #ARGV, 2 do
  local n = tonumber(ARGV[i + 1])
  redis.call('HINCRBY', KEYS[1], ARGV[i], n)
  if ARGV[i] == 'pages' then redis.call('HINCRBY', KEYS[2], ARGV[3], n) end
end
return 1
