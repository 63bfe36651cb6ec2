-- Extend the deadlines of leases still held (XX: never recreate a lost one).
-- KEYS[1] deadlines zset; ARGV[1] lease ms, ARGV[2..] tokens. Returns how many were renewed.
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local args = {}
for i = 2, #ARGV do args[#args + 1] = deadline; args[#args + 1] = ARGV[i] end
if #args == 0 then return 0 end
return redis.call('ZADD', KEYS[1], 'XX', 'CH', unpack(args))
