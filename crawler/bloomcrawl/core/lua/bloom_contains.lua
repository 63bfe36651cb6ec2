-- ARGV[1]: fingerprints, 20 bytes each; returns '1' (probably seen) / '0' per fingerprint
local found = check(ARGV[1])
local out = {}
for j = 1, #found do out[j] = found[j] and '1' or '0' end
return table.concat(out)
