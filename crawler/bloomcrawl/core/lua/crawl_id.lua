-- The id of the spider's crawl under way: dont_filter start requests go through the
-- filter under it, so each start URL is fetched once per crawl, whichever workers start.
-- KEYS[1] <spider>:crawl (a hash: field "id"; hash commands only, which the worker's
-- ACL role has); ARGV[1] "join" or "end"; ARGV[2] an id
-- join: set the id to ARGV[2] unless a crawl is under way; returns the crawl's id.
-- items: the items start() yields in crawl ARGV[2] go to the worker ARGV[3] unless
-- another took them; returns that worker's name (the same call sent twice: its own).
-- end: forget the id if it is still ARGV[2] (the crawl this worker joined), and who
-- took its start items; returns 1 when forgotten, 0 otherwise. Safe to send twice.
if ARGV[1] == 'join' then
  redis.call('HSETNX', KEYS[1], 'id', ARGV[2])
  return redis.call('HGET', KEYS[1], 'id')
end
if ARGV[1] == 'items' then
  redis.call('HSETNX', KEYS[1], 'start_items:' .. ARGV[2], ARGV[3])
  return redis.call('HGET', KEYS[1], 'start_items:' .. ARGV[2])
end
if redis.call('HGET', KEYS[1], 'id') == ARGV[2] then
  redis.call('HDEL', KEYS[1], 'id', 'start_items:' .. ARGV[2])
  return 1
end
return 0
