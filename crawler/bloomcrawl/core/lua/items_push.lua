-- Store an item once: its id is the fingerprint of the request whose response
-- yielded it and its position in the callback's output, so a page crawled
-- twice (a worker died before its ack) or a call sent twice stores nothing new.
-- KEYS[1] items list, KEYS[2] set of stored item ids; ARGV[1] item id, ARGV[2] item JSON
-- Returns 1 when stored, 0 when an item with this id was stored before.
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2])
return 1
