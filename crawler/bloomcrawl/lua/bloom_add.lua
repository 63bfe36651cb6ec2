-- ARGV[1]: fingerprints, 20 bytes each, concatenated
-- returns a string with one '1' (new) or '0' (seen) per fingerprint
local blob = ARGV[1]
local count = #blob / 20
local first_slices = nslices
local out, added = {}, 0
for j = 0, count - 1 do
  local h1, h2, h3, h4 = hashes(blob, j * 20)
  if add_item(h1, h2, h3, h4) then out[j + 1] = '1'; added = added + 1 else out[j + 1] = '0' end
end
save_counters(first_slices, count, count - added)
return table.concat(out)
