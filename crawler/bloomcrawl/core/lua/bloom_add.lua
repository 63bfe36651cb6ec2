-- ARGV[1]: fingerprints, 20 bytes each, concatenated
-- returns a string with one '1' (new) or '0' (seen) per fingerprint
local decided = decide(ARGV[1], nil)
local out = {}
for j = 1, #decided do out[j] = decided[j] and '1' or '0' end
return table.concat(out)
