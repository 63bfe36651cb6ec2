-- bloomcrawl: revisit windows (BLOOMFILTER_REVISIT_AFTER, BLOOMFILTER_REVISIT_WINDOWS)
-- over the bitmap backend, included after bloom_common.lua only for windowed filters:
-- it replaces decide() and check() by the same interface over rings of generations.
--
-- KEYS[1], the partition's state hash, is the template: the plan every generation
-- is created with (at error_rate / (g + 1)), 'generations' (g), and per ring its
-- span P = W / g in ms (0: a window that never forgets, one generation for good)
-- and its live generations' numbers, oldest first. Ring 0 is the default window
-- ('period_ms', 'gens'); ring i the i-th named window ('windows' lists their spans,
-- 'gens:<i>' their generations). A request chooses its ring by its flag: '0' ring
-- 0, 'a' ring 1, 'b' ring 2..., ('1' is dont_filter, as without a window).
-- Generation N of ring 0 is a growing filter of its own at "<tag>:g<N>:state", of
-- ring i at "<tag>:w<i>g<N>:state", with chunks "<...>:s<j>:c<k>" next to it: every
-- key keeps the partition's hash tag. The generation of a time t (Redis TIME) is
-- floor(t / P). A fingerprint is seen if any live generation of its ring has it,
-- else it is added to the ring's current one; when a call opens a new generation,
-- the one that has just left the window (current - g - 1) is kept one period more,
-- looked in only to tell a new item that was queued before (REVISITED, "revisited")
-- from one never queued or forgotten longer ago ("new"), and those older are retired
-- (UNLINK of their state and chunks: slices x chunks keys, never a scan of the bits).
-- An item added at t is live until (floor(t / P) + g + 1) P: at least W, at most
-- W (1 + 1/g) after t.
local partition_key = state_key
local plain_decide, plain_check = decide, check
local WINDOW = redis.call('HMGET', partition_key, 'period_ms', 'generations', 'gens', 'windows')
local GENERATIONS = tonumber(WINDOW[2])
if not GENERATIONS then
  return redis.error_reply('BLOOMCRAWL_NOFILTER no revisit window at ' .. partition_key)
end
local TAG = sub(partition_key, 1, -7)
-- per ring (0: default): its span, and its generations' names before the number
local PERIODS, PREFIXES = {[0] = tonumber(WINDOW[1])}, {[0] = TAG .. ':g'}
do
  local i = 0
  for p in string.gmatch(WINDOW[4] or '', '%d+') do
    i = i + 1
    PERIODS[i], PREFIXES[i] = tonumber(p), TAG .. ':w' .. i .. 'g'
  end
end
local NOW_MS = nil

local function generation_key(r, g)
  return PREFIXES[r] .. string.format('%d', g) .. ':state'
end

local function now_generation(r)
  local period = PERIODS[r]
  if period == 0 then return 0 end  -- never forgotten: one generation for good
  if not NOW_MS then
    local t = redis.call('TIME')
    NOW_MS = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end
  return floor(NOW_MS / period)
end

local function listed(r)
  local raw = WINDOW[3]
  if r > 0 then raw = redis.call('HGET', partition_key, 'gens:' .. r) end
  local gens = {}
  for g in string.gmatch(raw or '', '%d+') do gens[#gens + 1] = tonumber(g) end
  return gens
end

-- the items a generation holds (0 when it is gone)
local function held_by(key)
  local slices = tonumber(redis.call('HGET', key, 'slices'))
  if not slices then return 0 end
  local counts = {}
  for i = 0, slices - 1 do counts[i + 1] = 'items:' .. i end
  local held = 0
  for _, c in ipairs(redis.call('HMGET', key, unpack(counts))) do held = held + (tonumber(c) or 0) end
  return held
end

-- a generation's state: the template's plan, no items (bounded: max_slices fields); one
-- that exists (the partition's list was lost and written again) is kept as it is.
-- Its plan begins at the template's first slice that holds `held` items (what the
-- ring's previous generation held): a steady crawl's generation is then one or two
-- slices, not the template's small first ones, so a lookup reads few slices per
-- generation. Leaving slices out only lowers the compound error; at least half the
-- template's slices are kept to grow into.
local function create(r, g, held)
  local key = generation_key(r, g)
  if redis.call('EXISTS', key) == 1 then return end
  local values = redis.call('HMGET', partition_key, 'block_bytes', 'chunk_blocks', 'max_slices',
                            'hashing')
  local most = tonumber(values[3])
  local plans = {}
  for i = 0, most - 1 do plans[i + 1] = 'plan:' .. i end
  plans = redis.call('HMGET', partition_key, unpack(plans))
  local skip = 0
  while skip < floor(most / 2) do
    local cap = tonumber(string.match(plans[skip + 1] or '', '^(%d+) '))
    if not cap or cap >= held then break end
    skip = skip + 1
  end
  local args = {'slices', 1, 'filtered', 0, 'block_bytes', values[1], 'chunk_blocks', values[2],
                'max_slices', most - skip, 'hashing', values[4] or 1}
  for i = skip + 1, most do
    if plans[i] then args[#args + 1] = 'plan:' .. (i - 1 - skip); args[#args + 1] = plans[i] end
  end
  redis.call('HSET', key, unpack(args))
end

-- drop a generation's keys: its state and the chunks its plan gives its slices; its
-- duplicates found stay counted in the partition's 'filtered'
local function retire(r, g)
  local key = generation_key(r, g)
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

-- the ring's generations, oldest first, the current last, and the first one in the
-- window (the one before it, if any, is the generation kept to tell revisits): a new
-- current one is created and those it leaves behind the kept one retired (a clock gone
-- back keeps the newest)
local function live_generations(r)
  local current = now_generation(r)
  local gens = listed(r)
  if gens[#gens] and gens[#gens] >= current then
    local first = 1
    while first < #gens and gens[first] < current - GENERATIONS do first = first + 1 end
    return gens, first
  end
  -- the new one is sized from the newest before it, read before that may be retired
  local held = gens[#gens] and held_by(generation_key(r, gens[#gens])) or 0
  -- the one that has just left the window is kept one period more
  local keep, first = {}, 1
  for _, g in ipairs(gens) do
    if g >= current - GENERATIONS - 1 then
      keep[#keep + 1] = g
      if g < current - GENERATIONS then first = 2 end
    else
      retire(r, g)
    end
  end
  create(r, current, held)
  keep[#keep + 1] = current
  redis.call('HSET', partition_key, r > 0 and 'gens:' .. r or 'gens', table.concat(keep, ' '))
  return keep, first
end

-- the fingerprints of blob at the given indexes (1-based), as one blob
local function pick(blob, indexes)
  local parts = {}
  for q, j in ipairs(indexes) do parts[q] = sub(blob, j * 20 - 19, j * 20) end
  return table.concat(parts)
end

-- looks the pending fingerprints up in ring r's generations first..last (newest
-- first); those found are set to true in out; returns the ones not found, and how
-- many were
local function look_older(blob, pending, r, gens, first, last, out)
  local hits = 0
  for at = first, last, -1 do
    if #pending == 0 then break end
    if retarget(generation_key(r, gens[at])) then  -- a lost generation holds nothing
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

-- the fingerprints to decide by ring: ring -> their indexes, and the rings in order;
-- dont_filter ones (flag '1') are set true in out
local function by_ring(blob, flags, out)
  local rings, order = {}, {}
  for j = 1, #blob / 20 do
    local f = flags and byte(flags, j) or 48
    if f == 49 then
      out[j] = true
    else
      local r = f >= 97 and f - 96 or 0
      if not PERIODS[r] then
        error({err = 'BLOOMCRAWL_NOWINDOW no revisit window ' .. r .. ' at ' .. partition_key})
      end
      local list = rings[r]
      if not list then list = {}; rings[r] = list; order[#order + 1] = r end
      list[#list + 1] = j
    end
  end
  return rings, order
end

-- decide(): seen in any live generation of the request's ring, else added to its
-- current one
local function window_decide(blob, flags)
  local out = {}
  local rings, order = by_ring(blob, flags, out)
  local hits, revisits = 0, 0
  for _, r in ipairs(order) do
    local gens, first = live_generations(r)
    local seen = {}
    local pending, found = look_older(blob, rings[r], r, gens, #gens - 1, first, seen)
    hits = hits + found
    for j in pairs(seen) do out[j] = false end
    if #pending > 0 then
      local current = generation_key(r, gens[#gens])
      if not retarget(current) then  -- lost (evicted, deleted): begun again
        create(r, gens[#gens], 0)
        retarget(current)
      end
      local kept = plain_decide(pick(blob, pending), nil)
      local new = {}
      for q, j in ipairs(pending) do
        out[j] = kept[q]
        if kept[q] then new[#new + 1] = j end
      end
      -- queued before, and forgotten since: in the generation kept out of the window
      if first > 1 and #new > 0 then
        REVISITED = REVISITED or {}
        local _, n = look_older(blob, new, r, gens, first - 1, first - 1, REVISITED)
        revisits = revisits + n
      end
    end
  end
  if hits > 0 then redis.call('HINCRBY', partition_key, 'filtered', hits) end
  if revisits > 0 then redis.call('HINCRBY', partition_key, 'revisited', revisits) end
  return out
end

-- check(): whether any generation of the request's ring still in the window has each
-- fingerprint; writes nothing
local function window_check(blob, flags)
  local out = {}
  for j = 1, #blob / 20 do out[j] = false end
  local rings, order = by_ring(blob, flags, out)
  for _, r in ipairs(order) do
    local current = now_generation(r)
    local gens = {}
    for _, g in ipairs(listed(r)) do
      if g >= current - GENERATIONS then gens[#gens + 1] = g end
    end
    look_older(blob, rings[r], r, gens, #gens, 1, out)
  end
  return out
end

local decide, check = window_decide, window_check
