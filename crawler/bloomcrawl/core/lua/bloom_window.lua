-- bloomcrawl: a revisit window (BLOOMFILTER_REVISIT_AFTER) over the bitmap backend,
-- included after bloom_common.lua only for windowed filters: it replaces decide() and
-- check() by the same interface over the partition's live generations.
--
-- KEYS[1], the partition's state hash, is the template: the plan every generation
-- is created with (at error_rate / (g + 1)), 'period_ms' (P = W / g), 'generations'
-- (g) and 'gens', the live generations' numbers, oldest first. Generation N is a
-- growing filter of its own at "<tag>:g<N>:state", chunks "<tag>:g<N>:s<i>:c<j>":
-- every key keeps the partition's hash tag. The generation of a time t (Redis TIME)
-- is floor(t / P). A fingerprint is seen if any live generation has it, else it is
-- added to the current one; when a call opens a new generation, those older than
-- current - g are retired (UNLINK of their state and chunks: slices x chunks keys,
-- never a scan of the bits). An item added at t is live until (floor(t / P) + g + 1) P:
-- at least W, at most W (1 + 1/g) after t.
local partition_key = state_key
local plain_decide, plain_check = decide, check
local WINDOW = redis.call('HMGET', partition_key, 'period_ms', 'generations', 'gens')
local PERIOD, GENERATIONS = tonumber(WINDOW[1]), tonumber(WINDOW[2])
if not PERIOD then
  return redis.error_reply('BLOOMCRAWL_NOFILTER no revisit window at ' .. partition_key)
end
local TAG = sub(partition_key, 1, -7)

local function generation_key(g)
  return TAG .. ':g' .. string.format('%d', g) .. ':state'
end

local function now_generation()
  local t = redis.call('TIME')
  return floor((tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)) / PERIOD)
end

local function listed()
  local gens = {}
  for g in string.gmatch(WINDOW[3] or '', '%d+') do gens[#gens + 1] = tonumber(g) end
  return gens
end

-- a generation's state: the template's plan, no items (bounded: max_slices fields); one
-- that exists (the partition's list was lost and written again) is kept as it is
local function create(g)
  if redis.call('EXISTS', generation_key(g)) == 1 then return end
  local fields = {'block_bytes', 'chunk_blocks', 'max_slices', 'hashing'}
  for i = 0, MAX_SLICES - 1 do fields[#fields + 1] = 'plan:' .. i end
  local values = redis.call('HMGET', partition_key, unpack(fields))
  local args = {'slices', 1, 'filtered', 0}
  for i = 1, #fields do
    if values[i] then args[#args + 1] = fields[i]; args[#args + 1] = values[i] end
  end
  redis.call('HSET', generation_key(g), unpack(args))
end

-- drop a generation's keys: its state and the chunks its plan gives its slices; its
-- duplicates found stay counted in the partition's 'filtered'
local function retire(g)
  local key = generation_key(g)
  local f = redis.call('HMGET', key, 'slices', 'chunk_blocks', 'filtered')
  local slices, chunk_blocks = tonumber(f[1]), tonumber(f[2])
  if slices and chunk_blocks then
    local fields = {}
    for i = 0, slices - 1 do fields[i + 1] = 'plan:' .. i end
    local plans = redis.call('HMGET', key, unpack(fields))
    local prefix_g = sub(key, 1, -7)
    local names = {}
    for i = 0, slices - 1 do
      local blocks = tonumber(string.match(plans[i + 1] or '', '^%d+ %d+ (%d+)$')) or 0
      for c = 0, math.ceil(blocks / chunk_blocks) - 1 do
        names[#names + 1] = prefix_g .. ':s' .. i .. ':c' .. c
        if #names == 1000 then redis.call('UNLINK', unpack(names)); names = {} end
      end
    end
    if #names > 0 then redis.call('UNLINK', unpack(names)) end
    local filtered = tonumber(f[3]) or 0
    if filtered > 0 then redis.call('HINCRBY', partition_key, 'filtered', filtered) end
  end
  redis.call('UNLINK', key)
end

-- the live generations, oldest first, the current last: a new current one is created
-- and those it leaves out of the window retired (a clock gone back keeps the newest)
local function live_generations()
  local current = now_generation()
  local gens = listed()
  if gens[#gens] and gens[#gens] >= current then return gens end
  local keep = {}
  for _, g in ipairs(gens) do
    if g < current - GENERATIONS then retire(g) else keep[#keep + 1] = g end
  end
  create(current)
  keep[#keep + 1] = current
  redis.call('HSET', partition_key, 'gens', table.concat(keep, ' '))
  return keep
end

-- the fingerprints of blob at the given indexes (1-based), as one blob
local function pick(blob, indexes)
  local parts = {}
  for q, j in ipairs(indexes) do parts[q] = sub(blob, j * 20 - 19, j * 20) end
  return table.concat(parts)
end

-- looks the pending fingerprints up in generations first..last (newest first); those
-- found are set to `found_value` in out; returns the ones not found, and how many were
local function look_older(blob, pending, gens, first, last, out)
  local hits = 0
  for at = first, last, -1 do
    if #pending == 0 then break end
    if retarget(generation_key(gens[at])) then  -- a lost generation holds nothing
      local found = plain_check(pick(blob, pending))
      local still = {}
      for q, j in ipairs(pending) do
        if found[q] then out[j] = true; hits = hits + 1 else still[#still + 1] = j end
      end
      pending = still
    end
  end
  return pending, hits
end

-- decide(): seen in any live generation, else added to the current one
local function window_decide(blob, flags)
  local gens = live_generations()
  local out, pending = {}, {}
  for j = 1, #blob / 20 do
    if flags and byte(flags, j) == 49 then out[j] = true else pending[#pending + 1] = j end
  end
  local seen = {}
  local hits
  pending, hits = look_older(blob, pending, gens, #gens - 1, 1, seen)
  for j in pairs(seen) do out[j] = false end
  if #pending > 0 then
    local current = generation_key(gens[#gens])
    if not retarget(current) then  -- lost (evicted, deleted): begun again
      create(gens[#gens])
      retarget(current)
    end
    local kept = plain_decide(pick(blob, pending), nil)
    for q, j in ipairs(pending) do out[j] = kept[q] end
  end
  if hits > 0 then redis.call('HINCRBY', partition_key, 'filtered', hits) end
  return out
end

-- check(): whether any generation still in the window has each fingerprint; writes nothing
local function window_check(blob)
  local current = now_generation()
  local gens = {}
  for _, g in ipairs(listed()) do
    if g >= current - GENERATIONS then gens[#gens + 1] = g end
  end
  local out, pending = {}, {}
  for j = 1, #blob / 20 do out[j] = false; pending[j] = j end
  look_older(blob, pending, gens, #gens, 1, out)
  return out
end

local decide, check = window_decide, window_check
