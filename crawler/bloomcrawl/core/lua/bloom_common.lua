-- bloomcrawl: the bitmap backend of the partition scripts (blocked, scalable Bloom filter).
-- Defines decide(blob, flags) and check(blob), the interface the script bodies use.
--
-- One call touches one partition, so every key it names shares one hash tag
-- (one Redis Cluster slot). KEYS[1] is the partition's state hash, ending in
-- ":state"; bit chunks are "<tag>:s<slice>:c<chunk>" next to it.
--
-- Each item's k bits lie in one block of BLOCK_BYTES bytes: block index from
-- fingerprint bytes 1-6, the bits' positions from bytes 7-15 (7-12 for filters
-- hashed before, 'hashing' 1). One GETRANGE reads the block; a new item writes
-- back only the span of bytes that changed.
local state_key = KEYS[1]
local prefix = string.sub(state_key, 1, -7)
local byte, char, sub = string.byte, string.char, string.sub
local floor = math.floor
local MASK = {[0] = 128, 64, 32, 16, 8, 4, 2, 1}

-- one read for the partition's parameters and its first slice
local head = redis.call('HMGET', state_key, 'slices', 'block_bytes', 'chunk_blocks', 'max_slices',
                        'plan:0', 'items:0', 'hashing')
local nslices = tonumber(head[1])
if not nslices then
  return redis.error_reply('BLOOMCRAWL_NOFILTER no filter partition at ' .. state_key)
end
local BLOCK_BYTES = tonumber(head[2])
local BLOCK_BITS = BLOCK_BYTES * 8
local CHUNK_BLOCKS = tonumber(head[3])
local MAX_SLICES = tonumber(head[4])
-- 2: each lane's position from a quadratic sequence of 24-bit values (see below);
-- 1 (no field: filters made before): triple hashing of 16-bit values
local QUADRATIC = head[7] == '2'
local M24 = 16777216

-- per-slice parameters, index 1..nslices; s_added: items this call added
local s_cap, s_k, s_blocks, s_items, s_added, s_bits_set = {}, {}, {}, {}, {}, {}
local function set_slice(i, plan, items)
  local c, k, b = string.match(plan, '^(%d+) (%d+) (%d+)$')
  s_cap[i], s_k[i], s_blocks[i] = tonumber(c), tonumber(k), tonumber(b)
  s_items[i] = tonumber(items) or 0
  s_added[i], s_bits_set[i] = 0, 0
end
local function load_slice(i)
  local f = redis.call('HMGET', state_key, 'plan:' .. (i - 1), 'items:' .. (i - 1))
  set_slice(i, f[1], f[2])
end
set_slice(1, head[5], head[6])
if nslices > 1 then  -- the other slices in one read
  local fields = {}
  for i = 2, nslices do
    fields[2 * i - 3] = 'plan:' .. (i - 1)
    fields[2 * i - 2] = 'items:' .. (i - 1)
  end
  local f = redis.call('HMGET', state_key, unpack(fields))
  for i = 2, nslices do set_slice(i, f[2 * i - 3], f[2 * i - 2]) end
end

local function mod(a, m)
  local r = a - floor(a / m) * m
  if r < 0 then r = r + m elseif r >= m then r = r - m end
  return r
end

-- where item (h1) lives in slice i: key and byte offset of its block
local chunk_keys = {}
local function locate(i, h1)
  local bidx = mod(h1, s_blocks[i])
  local chunk = floor(bidx / CHUNK_BLOCKS)
  local off = (bidx - chunk * CHUNK_BLOCKS) * BLOCK_BYTES
  local id = chunk * 64 + i
  local key = chunk_keys[id]
  if not key then
    key = prefix .. ':s' .. (i - 1) .. ':c' .. chunk
    chunk_keys[id] = key
  end
  return key, off, chunk
end

-- first write into a chunk: allocate it whole, in one allocation (growing a
-- string by SETRANGE over-allocates up to twice its size)
local function allocate(i, key, chunk)
  local blocks = math.min(CHUNK_BLOCKS, s_blocks[i] - chunk * CHUNK_BLOCKS)
  local size = blocks * BLOCK_BYTES
  if redis.call('STRLEN', key) < size then
    redis.call('SETRANGE', key, size - 1, '\0')
  end
end

-- The block is cut into k lanes of w = floor(BLOCK_BITS / k) bits; bit t of an
-- item lies in lane t, so positions come in order. Where in the lane: with
-- QUADRATIC, v = (a + t*b + t^2*c) mod 2^24 for 24-bit a, b, c (by differences:
-- v grows by d = b + (2t+1)*c), scaled to floor(v * w / 2^24): two items share
-- every lane with probability far below the error rates the slices are sized
-- for. Else (h2 + t*h3 + t(t-1)/2 * h4) mod w, triple hashing, whose w^3
-- patterns per block add about load / w^3 to the false-positive rate. All of
-- it is exact in Lua's doubles.

-- true when all k bits of the item are set in slice i's block, which starts at
-- byte base + 1 of blk
local function all_set(blk, base, i, h2, h3, h4)
  local k = s_k[i]
  local w = floor(BLOCK_BITS / k)
  local v, d, c2 = h2, h3 + h4, h4 + h4
  for t = 0, k - 1 do
    local pos
    if QUADRATIC then
      local x = v % M24 * w
      pos = t * w + (x - x % M24) / M24
      v, d = v + d, d + c2
    else
      pos = t * w + (h2 + t * h3 + t * (t - 1) / 2 * h4) % w
    end
    local r8 = pos % 8
    local m = MASK[r8]
    if byte(blk, base + (pos - r8) / 8 + 1) % (m + m) < m then return false end
  end
  return true
end

-- A GETRANGE costs about what copying 1 KB does. Slices older than the newest
-- when the call began are not written by it: one that is a single chunk of
-- fewer than WHOLE_READ_BYTES per lookup the call is still expected to make in
-- it is read whole, once, and its blocks are looked up in that copy (with many
-- slices, most are small; new items look in every slice, duplicates in few).
local WHOLE_READ_BYTES = 512
local frozen_below = nslices  -- set by decide() and check()
local undecided = 0           -- items of the call still to decide
local count_done = 0          -- items of the call decided
local whole = {}              -- slice -> its chunk read whole
local lookups = {}            -- slice -> blocks read from it by this call

-- true when all k bits of the item are set in slice i
local function present(i, h1, h2, h3, h4)
  local w = whole[i]
  if not w and i < frozen_below and s_blocks[i] <= CHUNK_BLOCKS then
    -- lookups still expected in slice i: as many per item as so far (the first
    -- item counts as one)
    local seen = lookups[i] or 0
    local done = count_done + 1
    if s_blocks[i] * BLOCK_BYTES <= (seen + 1) / done * undecided * WHOLE_READ_BYTES then
      w = redis.call('GET', prefix .. ':s' .. (i - 1) .. ':c0') or ''
      whole[i] = w
    else
      lookups[i] = seen + 1
    end
  end
  local blk, base
  if w then
    blk, base = w, mod(h1, s_blocks[i]) * BLOCK_BYTES
  else
    local key, off = locate(i, h1)
    blk, base = redis.call('GETRANGE', key, off, off + BLOCK_BYTES - 1), 0
  end
  if #blk < base + BLOCK_BYTES then  -- a chunk never written (or cut short)
    if #blk <= base then return false end
    blk, base = sub(blk, base + 1) .. string.rep('\0', base + BLOCK_BYTES - #blk), 0
  end
  return all_set(blk, base, i, h2, h3, h4)
end

-- set the item's bits in blk, slice i's block at offset off of chunk key: writes
-- back only the span of bytes that changed; returns the number of bits newly set
local function write_bits(i, key, off, blk, h2, h3, h4)
  local k = s_k[i]
  local w = floor(BLOCK_BITS / k)
  local parts, np = nil, 0
  local n, lo, cur_bi, cur_val = 0, 0, 0, 0
  local v, d, c2 = h2, h3 + h4, h4 + h4
  for t = 0, k - 1 do
    local pos
    if QUADRATIC then
      local x = v % M24 * w
      pos = t * w + (x - x % M24) / M24
      v, d = v + d, d + c2
    else
      pos = t * w + (h2 + t * h3 + t * (t - 1) / 2 * h4) % w
    end
    local r8 = pos % 8
    local bi = (pos - r8) / 8 + 1
    local m = MASK[r8]
    local val
    if bi == cur_bi then val = cur_val else val = byte(blk, bi) end
    if val % (m + m) < m then
      n = n + 1
      if bi == cur_bi then
        cur_val = cur_val + m
      else
        if cur_bi == 0 then
          parts = {}; lo = bi
        else
          np = np + 1; parts[np] = char(cur_val)
          if bi > cur_bi + 1 then np = np + 1; parts[np] = sub(blk, cur_bi + 1, bi - 1) end
        end
        cur_bi = bi; cur_val = val + m
      end
    end
  end
  if n == 0 then return 0 end
  np = np + 1; parts[np] = char(cur_val)
  redis.call('SETRANGE', key, off + lo - 1, table.concat(parts))
  return n
end

local function hashes(blob, p)
  if QUADRATIC then
    local a1, a2, a3, a4, a5, a6, b1, b2, b3, c1, c2, c3, d1, d2, d3 = byte(blob, p + 1, p + 15)
    local h1 = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
    return h1, (b1 * 256 + b2) * 256 + b3, (c1 * 256 + c2) * 256 + c3, (d1 * 256 + d2) * 256 + d3
  end
  local a1, a2, a3, a4, a5, a6, b1, b2, c1, c2, d1, d2 = byte(blob, p + 1, p + 12)
  local h1 = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
  return h1, b1 * 256 + b2, c1 * 256 + c2, d1 * 256 + d2
end

-- add one item: true when it was new. Grows the filter when the newest slice is full.
-- (decide() refuses a call when the last possible slice is full: see below.)
-- the slices in the order lookups try them: most items first, where a duplicate
-- most likely is (the newest once it holds more than the one before it)
local order = {}
local function order_slices()
  for i = 1, nslices do order[i] = i end
  table.sort(order, function(a, b)
    if s_items[a] ~= s_items[b] then return s_items[a] > s_items[b] end
    return a > b
  end)
end

local function add_item(h1, h2, h3, h4)
  if s_items[nslices] >= s_cap[nslices] and nslices < MAX_SLICES then
    nslices = nslices + 1
    load_slice(nslices)
    order_slices()
  end
  local newest = nslices
  -- the newest slice's block is read in its turn and kept: a new item is written there
  local key, off, chunk, blk, unallocated
  for n = 1, nslices do
    local i = order[n]
    if i == newest then
      key, off, chunk = locate(newest, h1)
      blk = redis.call('GETRANGE', key, off, off + BLOCK_BYTES - 1)
      unallocated = #blk < BLOCK_BYTES
      if unallocated then
        blk = blk .. string.rep('\0', BLOCK_BYTES - #blk)
      elseif all_set(blk, 0, newest, h2, h3, h4) then
        return false
      end
    elseif present(i, h1, h2, h3, h4) then
      return false
    end
  end
  if unallocated then allocate(newest, key, chunk) end
  local n = write_bits(newest, key, off, blk, h2, h3, h4)
  if n == 0 then return false end
  s_bits_set[newest] = s_bits_set[newest] + n
  s_items[newest] = s_items[newest] + 1
  s_added[newest] = s_added[newest] + 1
  return true
end

local function contains_item(h1, h2, h3, h4)
  for n = 1, nslices do
    if present(order[n], h1, h2, h3, h4) then return true end
  end
  return false
end

-- write back the counters an add call changed (checked = items + filtered)
local function save_counters(first_slices, filtered)
  for i = 1, nslices do
    if s_added[i] > 0 then
      redis.call('HINCRBY', state_key, 'bits_set:' .. (i - 1), s_bits_set[i])
      redis.call('HINCRBY', state_key, 'items:' .. (i - 1), s_added[i])
    end
  end
  if filtered > 0 then redis.call('HINCRBY', state_key, 'filtered', filtered) end
  if nslices ~= first_slices then redis.call('HSET', state_key, 'slices', nslices) end
end

-- Check-and-set each fingerprint of blob (20 bytes each); flags (optional) has one
-- character per fingerprint, '1' meaning dont_filter: kept without touching the filter.
-- Returns a table of booleans: true = new (or dont_filter), false = seen.
local function decide(blob, flags)
  local count = #blob / 20
  -- the last slice the plan allows is full: answering "seen" from here on would
  -- drop every new URL silently, so refuse before anything is written
  if nslices >= MAX_SLICES and s_items[nslices] >= s_cap[nslices] then
    error({err = 'BLOOMCRAWL_FULL the Bloom filter partition at ' .. state_key ..
                             ' holds ' .. s_items[nslices] .. ' items in its last slice (' ..
                             MAX_SLICES .. ' slices): raise BLOOMFILTER_CAPACITY or' ..
                             ' BLOOMFILTER_GROWTH for a new filter'})
  end
  local first_slices = nslices
  frozen_below = nslices
  order_slices()
  local out, filtered = {}, 0
  for j = 0, count - 1 do
    undecided, count_done = count - j, j
    if flags and byte(flags, j + 1) == 49 then
      out[j + 1] = true
    else
      local h1, h2, h3, h4 = hashes(blob, j * 20)
      local new = add_item(h1, h2, h3, h4)
      out[j + 1] = new
      if not new then filtered = filtered + 1 end
    end
  end
  save_counters(first_slices, filtered)
  return out
end

local function check(blob)
  local out = {}
  local count = #blob / 20
  frozen_below = nslices + 1  -- nothing is written
  order_slices()
  for j = 0, count - 1 do
    undecided, count_done = count - j, j
    local h1, h2, h3, h4 = hashes(blob, j * 20)
    out[j + 1] = contains_item(h1, h2, h3, h4)
  end
  return out
end
