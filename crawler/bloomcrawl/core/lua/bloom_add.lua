-- ARGV[1]: fingerprints, 20 bytes each, concatenated; ARGV[2] (optional, '' for none): one
-- flag per fingerprint, a revisit window's ring (bloom_window.lua)
-- KEYS[2] and ARGV[3] (optional): the caller's record of its last call and this call's
-- token. A call sent again after its reply was lost (by the caller, or by a cluster
-- client on its own) answers what its first send decided, read from the record, instead
-- of finding seen what that send added.
-- returns a string with one '1' (new) or '0' (seen) per fingerprint
local record, token = KEYS[2], ARGV[3]
if record then
  local last = redis.call('GET', record)
  if last and string.sub(last, 1, #token + 1) == token .. ' ' then
    return string.sub(last, #token + 2)
  end
end
local flags = ARGV[2]
if flags == '' then flags = nil end
local decided = decide(ARGV[1], flags)
local answer
if #decided == 1 then  -- a single request_seen
  answer = decided[1] and '1' or '0'
else
  local out = {}
  for j = 1, #decided do out[j] = decided[j] and '1' or '0' end
  answer = table.concat(out)
end
if record then redis.call('SET', record, token .. ' ' .. answer, 'PX', '600000') end
return answer
