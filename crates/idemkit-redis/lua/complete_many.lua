-- complete_many: complete.lua for several keys of one slot, in one script call (completions
-- coalesced by the client while another is on the wire). Each key is answered exactly as
-- complete.lua answers it alone, in KEYS order; a key given twice is completed by the first
-- of its owners that holds it, as two calls one after the other would be.
--
-- KEYS       the record keys (one slot)
-- ARGV[3i-2] key i's owner token (16 bytes) and fencing token (8 bytes)
-- ARGV[3i-1] its ttl ms  ARGV[3i] its outcome as the record's tail
-- Returns an array of 1 (completed) or 0 (the caller no longer owns the key).
local out = {}
for i, key in ipairs(KEYS) do
  local lease = ARGV[3 * i - 2]
  local v = redis.call('GET', key)
  local reply = 0
  if v and string.sub(v, 7, 30) == lease then
    local head = string.sub(v, 1, 5)
    -- Version 1 or 2 (a holder block), kept as it is.
    if head == 'IDK\1\1' or head == 'IDK\2\1' then
      local flags = string.byte(v, 6)
      if flags < 2 then
        redis.call('PSETEX', key, ARGV[3 * i - 1], string.sub(v, 1, 4) .. '\2' .. string.sub(v, 6) .. ARGV[3 * i])
      else
        redis.call('PSETEX', key, ARGV[3 * i - 1],
          string.sub(v, 1, 4) .. '\2' .. string.char(flags - 2) .. string.sub(v, 7) .. ARGV[3 * i])
        redis.call('PUBLISH', key .. ':wake', '')
      end
      reply = 1
    elseif head == 'IDK\1\2' or head == 'IDK\2\2' then
      reply = 1
    end
  end
  out[i] = reply
end
return out
