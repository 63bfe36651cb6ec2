-- Ack leases by token: only the holder's own token matches, so a worker whose
-- lease expired and was handed on cannot remove the new holder's lease. Each
-- ended lease frees a slot of its host.
-- KEYS[1] leases hash, KEYS[2] deadlines zset, KEYS[3..8] politeness (polite_common)
-- ARGV[1] politeness cfg, ARGV[2] queue type, ARGV[3..] tokens. Returns how many were held.
polite_init(3, ARGV[1])
PR.qtype = ARGV[2]
local held = 0
for i = 3, #ARGV do
  held = held + end_lease(KEYS[1], KEYS[2], ARGV[i])
end
return held
