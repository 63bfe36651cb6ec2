-- Add the counts of one worker's numbered exchanges to the shared stats, each
-- number once however often it is sent.
-- KEYS[1] stats hash, KEYS[2] pages-by-node hash, KEYS[3] hash worker -> last applied number
-- ARGV[1] worker, ARGV[2] the worker's host name, then for each exchange, lowest
-- number first: its number (a worker numbers them 1, 2, 3, ...), how many fields
-- follow, then field, increment, field, increment, ...
-- All of a batch's numbers travel in this one call: in separate calls of one
-- pipeline, a NOSCRIPT reply to the first (another client loads the script
-- between the two) would let the second apply first and the first be refused.
-- KEYS[4] the workers alive (frontier_workers.lua): the call also tells whether the
-- worker is alone in the crawl, the only one alive being itself.
-- Returns {how many numbers were applied, 1 alone or 0}.
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local applied = 0
local i = 3
while i <= #ARGV do
  local seq = tonumber(ARGV[i])
  local fields = tonumber(ARGV[i + 1])
  if seq > last then
    for j = i + 2, i + 2 * fields, 2 do
      local n = tonumber(ARGV[j + 1])
      redis.call('HINCRBY', KEYS[1], ARGV[j], n)
      if ARGV[j] == 'pages' then redis.call('HINCRBY', KEYS[2], ARGV[2], n) end
    end
    last = seq
    applied = applied + 1
  end
  i = i + 2 + 2 * fields
end
if applied > 0 then redis.call('HSET', KEYS[3], ARGV[1], last) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive = redis.call('ZRANGEBYSCORE', KEYS[4], now, '+inf', 'LIMIT', '0', '2')
return {applied, (#alive == 1 and alive[1] == ARGV[1]) and 1 or 0}
