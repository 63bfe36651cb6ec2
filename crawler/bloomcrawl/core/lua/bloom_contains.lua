-- ARGV[1]: fingerprints, 20 bytes each; ARGV[2] (optional): a revisit window's flag per
-- fingerprint (bloom_window.lua); returns '1' (probably seen) / '0' per fingerprint
local found = check(ARGV[1], ARGV[2])
local out = {}
for j = 1, #found do out[j] = found[j] and '1' or '0' end
return table.concat(out)
