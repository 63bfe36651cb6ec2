-- Claim a schedule's slot: once per slot, however many timers ask.
-- KEYS[1] the schedule's hash; ARGV[1] the slot (seconds since the epoch, as the
-- timer computed it from TIME), ARGV[2] the timer's id.
-- Returns 1 when this call claimed the slot, or when this timer claimed it before and has
-- not recorded its firing ('fired_slot'): the same claim sent again after its reply was
-- lost; 0 when the schedule is gone or paused, or this slot (or a later one) was claimed
-- already.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'paused') == '1' then return 0 end
local slot = tonumber(ARGV[1])
local last = redis.call('HGET', KEYS[1], 'last_slot')
if last and tonumber(last) >= slot then
  if last == ARGV[1] and redis.call('HGET', KEYS[1], 'claimed_by') == ARGV[2]
      and redis.call('HGET', KEYS[1], 'fired_slot') ~= ARGV[1] then
    return 1
  end
  return 0
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'last_slot', ARGV[1], 'claimed_by', ARGV[2],
           'claimed_at', now[1] .. '.' .. string.format('%06d', tonumber(now[2])))
return 1
