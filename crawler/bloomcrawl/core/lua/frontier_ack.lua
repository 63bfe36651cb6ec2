-- Ack leases by token: only the holder's own token matches, so a worker whose
-- lease expired and was handed on cannot remove the new holder's lease.
-- KEYS[1] leases hash, KEYS[2] deadlines zset; ARGV: tokens. Returns how many were held.
local held = 0
for i = 1, #ARGV do
  held = held + redis.call('ZREM', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[1], ARGV[i])
end
return held
