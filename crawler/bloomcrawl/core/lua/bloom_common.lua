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
--
-- What every call pays before deciding anything is kept small (a single request_seen
-- is one call): the prelude reads one hash field list and defines few functions (each
-- closure made and each upvalue it captures is paid again on every call); the other
-- slices' plans are read on the first decide() or check().
local state_key = KEYS[1]
local byte, char, sub, floor = string.byte, string.char, string.sub, math.floor
-- Integers made into strings by format('%d'): Redis turns a Lua number passed to a
-- command into a string with sprintf('%.17g') (Lua, for a number joined with '..',
-- with '%.14g'), and that costs a GETRANGE about a fifth of its time; '%d' costs
-- less. Never a key's own name through '%s': Lua's format cuts a short string at a
-- NUL byte.
local format = string.format
-- a revisit window's decide() marks here (index -> true) the new items it found in the
-- generation that last left the window: queued again after their window (nil: none)
local REVISITED = nil

-- one read for the partition's parameters and its first slice; it also tells a missing
-- partition before anything is written
local HEAD_FIELDS = {'slices', 'block_bytes', 'chunk_blocks', 'max_slices', 'plan:0', 'items:0',
                     'hashing'}
local head = redis.call('HMGET', state_key, unpack(HEAD_FIELDS))
if not tonumber(head[1]) then
  return redis.error_reply('BLOOMCRAWL_NOFILTER no filter partition at ' .. state_key)
end
-- redisbloom_common.lua's check before a script's first write: the read above made it
local function require_filter() end

-- The partition, read by the first decide() or check() of the call: per slice (index
-- 1..n) its capacity CAP, hashes K and blocks BLOCKS; the newest slice's items, and
-- what this call added to it. Each table, string and closure a call makes costs it
-- again (allocation, then the garbage collector): a call makes few.
local CAP, K, BLOCKS
local n, items, added, bits_added = 0, 0, 0, 0
local BLOCK_BYTES, CHUNK_BLOCKS, MAX_SLICES = tonumber(head[2]), tonumber(head[3]), tonumber(head[4])
local BLOCK_BITS = BLOCK_BYTES * 8
-- 'hashing' 2: each lane's position from a quadratic sequence of 24-bit values (see
-- below); 1 (no field: filters made before): triple hashing of 16-bit values
local QUADRATIC = head[7] == '2'
local prefix = sub(state_key, 1, -7)
-- chunk key names built by a call of many items: (chunk * 64 + slice) -> name (a name
-- built again is a new string each time: hashed, interned, collected)
local NAMES = nil

-- Points decide() and check() at another state hash of the same hash tag (a
-- generation of a windowed partition, bloom_window.lua), whose chunks are named
-- after it as the partition's are; what the call had added to the previous one
-- must have been saved (decide() does). False, and nothing changed, when that
-- hash is missing. The plain scripts never call it: their hot path is the one above.
local function retarget(key)
  local h = redis.call('HMGET', key, unpack(HEAD_FIELDS))
  if not tonumber(h[1]) then return false end
  state_key, head, prefix = key, h, sub(key, 1, -7)
  BLOCK_BYTES, CHUNK_BLOCKS, MAX_SLICES = tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
  BLOCK_BITS, QUADRATIC = BLOCK_BYTES * 8, h[7] == '2'
  CAP, n, items, added, bits_added, NAMES = nil, 0, 0, 0, 0, nil
  return true
end

local function load_partition()
  n = tonumber(head[1])
  CAP, K, BLOCKS = {}, {}, {}
  local plans, last = head, 5
  if n > 1 then
    -- slices before the newest are full (a slice is added when the newest is): their
    -- plans and the newest's items, in one read
    local fields = {}
    for i = 2, n do fields[i - 1] = format('plan:%d', i - 1) end
    fields[n] = format('items:%d', n - 1)
    plans = redis.call('HMGET', state_key, unpack(fields))
    items = tonumber(plans[n]) or 0
    plans[0] = head[5]
    last = 0
  else
    items = tonumber(head[6]) or 0
  end
  for i = 1, n do
    local c, k, b = string.match(plans[last + i - 1], '^(%d+) (%d+) (%d+)$')
    CAP[i], K[i], BLOCKS[i] = tonumber(c), tonumber(k), tonumber(b)
  end
end

-- write back what this call added to the newest slice
local function save_newest()
  if added > 0 then
    redis.call('HINCRBY', state_key, format('bits_set:%d', n - 1), format('%d', bits_added))
    redis.call('HINCRBY', state_key, format('items:%d', n - 1), format('%d', added))
    added, bits_added = 0, 0
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
-- A lookup computes each lane's position as it tests it, and stops at the first bit
-- unset (in a slice that does not hold the item, after a lane or two): keeping the
-- positions in a table for the next slice would cost more than computing them again.
-- A new item's lane hashes are kept for the write, which computes its positions in the
-- newest slice as it sets them (a table of them, filled by the lookup and read by the
-- write, cost a new item 1-3 us more at k 14-24).
local HV2, HV3, HV4 = 0, 0, 0
-- the pieces of a new item's written span, one table for the call's items (a table a
-- item, grown piece by piece, was reallocated about 7 times, then collected)
local PARTS, concat = {}, table.concat
local MASK = {[0] = 128, 64, 32, 16, 8, 4, 2, 1}

-- A block's GETRANGE, with its key name and offsets, costs about what reading
-- 1.3 KB whole does. Slices older than the newest when the call began are not
-- written by it: one that is a single chunk of fewer than WHOLE_READ_BYTES per
-- lookup the call is still expected to make in it is read whole, once, and its
-- blocks are looked up in that copy (with many slices, most are small; new items
-- look in every slice, duplicates in few). The expectation counts every item
-- still to decide at the rate the call has looked in the slice so far, which
-- overcounts duplicates: 2048 cost a duplicate at a million fingerprints 0.93x
-- what 512 did, and 4096 the same as 2048. A call of one item reads no slice whole.
local WHOLE_READ_BYTES = 2048
-- Looks the item up in each slice, most items first (where a duplicate most likely
-- is): the newest and the one before it by items, then the older ones newest first
-- (they are full, and no larger than the one after them, since growth >= 1). Returns
-- true (seen), or false and the newest slice's block: key, offset, chunk, bytes,
-- whether its chunk is unallocated; HV2, HV3, HV4 then hold its lane hashes.
-- The item is fingerprint j (from 0) of blob, the call's items, of which undecided are
-- still to decide (this one included); its hashes: h1 the block, h2, h3, h4 the lanes'
-- a, b, c. newest: the slice written (0: none); frozen: slices below it may be read
-- whole (whole: slice -> its copy, looked: slice -> blocks read from it, nil for one
-- item).
local function lookup(blob, j, newest, frozen, whole, looked, undecided)
  -- the lane loops' upvalues as locals: one instruction less each time a lane reads one
  local mask, byte, rcall = MASK, byte, redis.call
  local p, h1, h2, h3, h4 = j * 20, 0, 0, 0, 0
  if QUADRATIC then
    local a1, a2, a3, a4, a5, a6, b1, b2, b3, c1, c2, c3, d1, d2, d3 = byte(blob, p + 1, p + 15)
    h1 = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
    h2, h3, h4 = (b1 * 256 + b2) * 256 + b3, (c1 * 256 + c2) * 256 + c3, (d1 * 256 + d2) * 256 + d3
  else
    local a1, a2, a3, a4, a5, a6, b1, b2, c1, c2, d1, d2 = byte(blob, p + 1, p + 12)
    h1 = ((((a1 * 256 + a2) * 256 + a3) * 256 + a4) * 256 + a5) * 256 + a6
    h2, h3, h4 = b1 * 256 + b2, c1 * 256 + c2, d1 * 256 + d2
  end
  local swap = n > 1 and items < CAP[n - 1]
  local n_key, n_off, n_chunk, n_blk, n_unallocated
  for at = 1, n do
    local i = n + 1 - at
    if swap and at < 3 then i = n - 2 + at end
    local blk, base = nil, 0
    local copy = whole and whole[i]
    if not copy and whole and i < frozen and BLOCKS[i] <= CHUNK_BLOCKS then
      -- lookups still expected in slice i: as many per item as so far (the first
      -- item counts as one)
      local seen = looked[i] or 0
      if BLOCKS[i] * BLOCK_BYTES <= (seen + 1) / (j + 1) * undecided * WHOLE_READ_BYTES then
        copy = rcall('GET', prefix .. format(':s%d:c0', i - 1)) or ''
        whole[i] = copy
      else
        looked[i] = seen + 1
      end
    end
    if copy then
      blk, base = copy, h1 % BLOCKS[i] * BLOCK_BYTES
    else
      local bidx = h1 % BLOCKS[i]
      local chunk = 0
      if bidx >= CHUNK_BLOCKS then chunk = (bidx - bidx % CHUNK_BLOCKS) / CHUNK_BLOCKS end
      local key = NAMES and NAMES[chunk * 64 + i]
      if not key then
        key = prefix .. format(':s%d:c%d', i - 1, chunk)
        if NAMES then NAMES[chunk * 64 + i] = key end
      end
      local off = (bidx - chunk * CHUNK_BLOCKS) * BLOCK_BYTES
      blk = rcall('GETRANGE', key, format('%d', off), format('%d', off + BLOCK_BYTES - 1))
      if i == newest then
        n_key, n_off, n_chunk = key, off, chunk
        n_unallocated = #blk < BLOCK_BYTES
        if n_unallocated then blk = blk .. string.rep('\0', BLOCK_BYTES - #blk) end
        n_blk = blk
      end
    end
    if #blk < base + BLOCK_BYTES then  -- a chunk never written (or cut short)
      if #blk > base then
        blk, base = sub(blk, base + 1) .. string.rep('\0', base + BLOCK_BYTES - #blk), 0
      else
        blk = nil
      end
    end
    if blk and not (i == newest and n_unallocated) then
      -- each lane computed and tested in one step, until a bit is unset: the loop a
      -- lookup spends most of its time in
      local k = K[i]
      local w = (BLOCK_BITS - BLOCK_BITS % k) / k
      local all, lane, b1 = true, 0, base + 1
      if QUADRATIC then
        local v, d, c2 = h2, h3 + h4, h4 + h4
        for _ = 1, k do
          local x = v % 16777216 * w
          local pos = lane + (x - x % 16777216) / 16777216
          v, d, lane = v + d, d + c2, lane + w
          local r8 = pos % 8
          local m = mask[r8]
          if byte(blk, (pos - r8) / 8 + b1) % (m + m) < m then all = false; break end
        end
      else
        for t = 0, k - 1 do
          local pos = lane + (h2 + t * h3 + t * (t - 1) / 2 * h4) % w
          lane = lane + w
          local r8 = pos % 8
          local m = mask[r8]
          if byte(blk, (pos - r8) / 8 + b1) % (m + m) < m then all = false; break end
        end
      end
      if all then return true end
    end
  end
  if newest > 0 then HV2, HV3, HV4 = h2, h3, h4 end  -- the write's lanes, from these
  return false, n_key, n_off, n_chunk, n_blk, n_unallocated
end

-- Check-and-set each fingerprint of blob (20 bytes each); flags (optional) has one
-- character per fingerprint, '1' meaning dont_filter: kept without touching the filter.
-- Returns a table of booleans: true = new (or dont_filter), false = seen. Grows the
-- partition when its newest slice is full; refuses the call (before anything is written)
-- when the last slice the plan allows is full: answering "seen" from there on would
-- drop every new URL silently.
local function decide(blob, flags)
  if not CAP then load_partition() end
  if n >= MAX_SLICES and items >= CAP[n] then
    error({err = 'BLOOMCRAWL_FULL the Bloom filter partition at ' .. state_key ..
                             ' holds ' .. items .. ' items in its last slice (' ..
                             MAX_SLICES .. ' slices): raise BLOOMFILTER_CAPACITY or' ..
                             ' BLOOMFILTER_GROWTH for a new filter'})
  end
  local first_slices, frozen = n, n
  local count = #blob / 20
  local whole, looked
  if count > 1 then whole, looked, NAMES = {}, {}, NAMES or {} end
  local out, filtered = {}, 0
  for j = 0, count - 1 do
    if flags and byte(flags, j + 1) == 49 then
      out[j + 1] = true
    else
      if items >= CAP[n] and n < MAX_SLICES then  -- the newest is full: add a slice
        save_newest()
        local f = redis.call('HMGET', state_key, format('plan:%d', n), format('items:%d', n))
        n = n + 1
        local c, k, b = string.match(f[1], '^(%d+) (%d+) (%d+)$')
        CAP[n], K[n], BLOCKS[n] = tonumber(c), tonumber(k), tonumber(b)
        items = tonumber(f[2]) or 0
      end
      local seen, key, off, chunk, blk, unallocated =
        lookup(blob, j, n, frozen, whole, looked, count - j)
      local set = 0
      if not seen then
        if unallocated then
          -- first write into a chunk: allocate it whole, in one allocation (growing a
          -- string by SETRANGE over-allocates up to twice its size)
          local size = math.min(CHUNK_BLOCKS, BLOCKS[n] - chunk * CHUNK_BLOCKS) * BLOCK_BYTES
          if redis.call('STRLEN', key) < size then redis.call('SETRANGE', key, size - 1, '\0') end
        end
        -- set the item's bits in blk; write back only the span of bytes that changed
        local parts, np, lo, cur_bi, cur_val = PARTS, 0, 0, 0, 0
        local k = K[n]
        local w = (BLOCK_BITS - BLOCK_BITS % k) / k
        local mask, lane = MASK, 0
        local h2, h3, h4 = HV2, HV3, HV4
        local v, d, c2 = h2, h3 + h4, h4 + h4
        for t = 1, k do
          local pos
          if QUADRATIC then
            local x = v % 16777216 * w
            pos = lane + (x - x % 16777216) / 16777216
            v, d = v + d, d + c2
          else
            local i = t - 1
            pos = lane + (h2 + i * h3 + i * (i - 1) / 2 * h4) % w
          end
          lane = lane + w
          local r8 = pos % 8
          local bi, m = (pos - r8) / 8 + 1, mask[r8]
          local val
          if bi == cur_bi then val = cur_val else val = byte(blk, bi) end
          if val % (m + m) < m then
            set = set + 1
            if bi == cur_bi then
              cur_val = cur_val + m
            else
              if cur_bi == 0 then
                lo = bi
              else
                np = np + 1; parts[np] = char(cur_val)
                if bi > cur_bi + 1 then np = np + 1; parts[np] = sub(blk, cur_bi + 1, bi - 1) end
              end
              cur_bi, cur_val = bi, val + m
            end
          end
        end
        if set > 0 then
          np = np + 1; parts[np] = char(cur_val)
          redis.call('SETRANGE', key, format('%d', off + lo - 1), concat(parts, '', 1, np))
          bits_added, items, added = bits_added + set, items + 1, added + 1
        end
      end
      out[j + 1] = set > 0
      if set == 0 then filtered = filtered + 1 end
    end
  end
  -- write back the counters the call changed (checked = items + filtered)
  save_newest()
  if filtered > 0 then redis.call('HINCRBY', state_key, 'filtered', format('%d', filtered)) end
  if n ~= first_slices then redis.call('HSET', state_key, 'slices', format('%d', n)) end
  return out
end

-- whether each fingerprint of blob is (probably) in the filter; nothing is written
local function check(blob)
  if not CAP then load_partition() end
  local count = #blob / 20
  local whole, looked
  if count > 1 then whole, looked, NAMES = {}, {}, NAMES or {} end
  local out = {}
  for j = 0, count - 1 do
    out[j + 1] = (lookup(blob, j, 0, n + 1, whole, looked, count - j))
  end
  return out
end
