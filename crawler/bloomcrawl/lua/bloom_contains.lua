-- ARGV[1]: fingerprints, 20 bytes each; returns '1' (probably seen) / '0' per fingerprint
local blob = ARGV[1]
local out = {}
for j = 0, #blob / 20 - 1 do
  local h1, h2, h3, h4 = hashes(blob, j * 20)
  out[j + 1] = contains_item(h1, h2, h3, h4) and '1' or '0'
end
return table.concat(out)
