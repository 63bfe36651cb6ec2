-- ARGV[1]: fingerprints, 20 bytes each, concatenated; ARGV[2] (optional): one flag per
-- fingerprint, a revisit window's ring (bloom_window.lua)
-- returns a string with one '1' (new) or '0' (seen) per fingerprint
local decided = decide(ARGV[1], ARGV[2])
local out = {}
for j = 1, #decided do out[j] = decided[j] and '1' or '0' end
return table.concat(out)
