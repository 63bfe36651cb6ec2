-- bloomcrawl: the RedisBloom backend of the partition scripts.
-- KEYS[1] is the partition's state hash (":state"); the partition's scalable
-- RedisBloom filter is "<tag>:rb" next to it, created by BF.RESERVE when the
-- filter was created (never implicitly by BF.MADD, which would use defaults).
-- The state hash counts the duplicates found ('filtered'); the items added are the
-- module's own count (BF.INFO), so a new item writes no counter.
local state_key = KEYS[1]
local rb_key = string.sub(state_key, 1, -7) .. ':rb'
local byte, sub = string.byte, string.sub
-- as bloom_common.lua's: RedisBloom has no revisit window, so never set
local REVISITED = nil
-- A missing filter is an error, never a filter BF.MADD would make with its defaults.
-- decide() adds with BF.INSERT NOCREATE, which refuses a missing filter by itself; a
-- script that writes before it decides (frontier_enqueue.lua: its acks) calls
-- require_filter() first, so that nothing is half done. An EXISTS at the top of every
-- call cost a single request_seen 0.4 us of its 2.9.
local NOFILTER = 'BLOOMCRAWL_NOFILTER no filter partition at ' .. rb_key

local function require_filter()
  if redis.call('EXISTS', rb_key) == 0 then error({err = NOFILTER}) end
end

local function refused(reply)  -- BF.INSERT NOCREATE's error: the filter is gone, or another
  if string.find(reply.err, 'not found', 1, true) then error({err = NOFILTER}) end
  error(reply)
end

local function split(blob, flags, out)
  local fps, idx = {}, {}
  for j = 0, #blob / 20 - 1 do
    if flags and byte(flags, j + 1) == 49 then
      out[j + 1] = true
    else
      fps[#fps + 1] = sub(blob, j * 20 + 1, j * 20 + 20)
      idx[#idx + 1] = j + 1
    end
  end
  return fps, idx
end

local function decide(blob, flags)
  if #blob == 20 and not flags then
    -- one request_seen: what every call pays is most of its cost, so no list is built
    local r = redis.pcall('BF.INSERT', rb_key, 'NOCREATE', 'ITEMS', blob)
    if r.err then refused(r) end
    local new = r[1] == 1
    if not new then redis.call('HINCRBY', state_key, 'filtered', '1') end
    return {new}
  end
  local out = {}
  local fps, idx = split(blob, flags, out)
  local filtered = 0
  for s = 1, #fps, 1000 do
    local e = math.min(s + 999, #fps)
    local r = redis.pcall('BF.INSERT', rb_key, 'NOCREATE', 'ITEMS', unpack(fps, s, e))
    if r.err then refused(r) end
    for q = 1, #r do
      local new = r[q] == 1
      out[idx[s + q - 1]] = new
      if not new then filtered = filtered + 1 end
    end
  end
  if filtered > 0 then
    -- a '%d' string: Redis would make a Lua number into one with sprintf('%.17g')
    redis.call('HINCRBY', state_key, 'filtered', string.format('%d', filtered))
  end
  return out
end

local function check(blob)
  require_filter()  -- BF.MEXISTS answers 'not seen' for a missing filter
  local out = {}
  local fps, idx = split(blob, nil, out)
  for s = 1, #fps, 1000 do
    local e = math.min(s + 999, #fps)
    local r = redis.call('BF.MEXISTS', rb_key, unpack(fps, s, e))
    for q = 1, #r do out[idx[s + q - 1]] = r[q] == 1 end
  end
  return out
end
