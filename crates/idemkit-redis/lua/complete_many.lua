-- complete_many: complete.lua for several keys of one slot, in one script call (completions
-- coalesced by the client while another is on the wire). Each key is answered exactly as
-- complete.lua answers it alone (see there for the arguments' bytes), in KEYS order; a key
-- given twice is completed by the first of its owners that holds it, as two calls one after
-- the other would be.
--
-- KEYS        the record keys (one slot)
-- ARGV[1]     ttl ms (one for the batch)
-- ARGV[2i]    key i's reservation as its caller wrote it  ARGV[2i+1] its completed record
-- Returns an array of 1 (completed) or 0 (the caller no longer owns the key).
local ttl = ARGV[1]
local call, byte, sub = redis.call, string.byte, string.sub
local out = {}
for i = 1, #KEYS do
  local key, mine, done = KEYS[i], ARGV[2 * i], ARGV[2 * i + 1]
  local v = call('GET', key)
  local reply = 0
  if v == mine then
    call('PSETEX', key, ttl, done)
    reply = 1
  elseif v and sub(v, 7, 30) == sub(mine, 7, 30) then
    local a, b, c, version, state, flags = byte(v, 1, 6)
    if a == 73 and b == 68 and c == 75 and (version == 1 or version == 2) then
      if state == 1 then
        local outcome = sub(done, #mine + 1)
        if flags < 2 then
          call('PSETEX', key, ttl, sub(v, 1, 4) .. '\2' .. sub(v, 6) .. outcome)
        else
          call('PSETEX', key, ttl,
            sub(v, 1, 4) .. '\2' .. string.char(flags - 2) .. sub(v, 7) .. outcome)
          call('PUBLISH', key .. ':wake', '')
        end
        reply = 1
      elseif state == 2 then
        reply = 1
      end
    end
  end
  out[i] = reply
end
return out
