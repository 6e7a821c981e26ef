-- begin_many: begin.lua for several keys of one slot, in one script call (batch
-- reservation, and begins coalesced by the client). Each key is answered exactly as
-- begin.lua answers it alone (see there for the record format, the arguments' bytes and the
-- reply shapes); the replies come back as one array, in KEYS order. Redis' clock is read
-- once for the whole batch: every key's fencing token is that instant in microseconds, or
-- one past its released token (the keys are distinct, so one instant serves them all).
--
-- KEYS      the record keys (distinct, one slot)
-- ARGV[1]   lease ms (one for the batch)
-- ARGV[2]   the reservations' bytes from 31 on when every key shares them (no fingerprint,
--           one holder: the usual batch), then ARGV[2+i] key i's bytes 1-22;
--           or '' and then ARGV[1+2i] key i's bytes 1-22, ARGV[2+2i] its bytes from 31 on
-- Every argument costs Redis a string and a copy, so a shared tail is sent once.
local lease, shared = ARGV[1], ARGV[2]
local call, byte, sub, pack = redis.call, string.byte, string.sub, struct.pack
local t = call('TIME')
local now = t[1] * 1000000 + t[2]
local packed = pack('>I8', now)
local out = {}
for i = 1, #KEYS do
  local key, head, rest = KEYS[i]
  if shared == '' then
    head, rest = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  else
    head, rest = ARGV[2 + i], shared
  end
  local v = call('SET', key, head .. packed .. rest, 'NX', 'PX', lease, 'GET')
  if not v then
    out[i] = now
  else
    local reply = v
    local a, b, c, version, state = byte(v, 1, 5)
    if a == 73 and b == 68 and c == 75 then
      if (version == 1 or version == 2) and #v >= 46 then
        if state == 1 then
          if sub(v, 7, 22) == sub(head, 7) then
            -- Ours already (a batch sent again): renewed, as begin.lua does.
            local fingerprint = ''
            if byte(v, 6) % 2 == 1 then fingerprint = sub(v, 47, 62) end
            local ours = ''
            if byte(head, 6) % 2 == 1 then ours = sub(rest, 17, 32) end
            if fingerprint ~= ours then
              reply = 0
            else
              call('PEXPIRE', key, lease)
              reply = struct.unpack('>I8', v, 23)
            end
          else
            reply = {v, call('PTTL', key), now}
          end
        end
      elseif version == 1 and state == 3 and #v == 13 then
        local fencing = struct.unpack('>I8', v, 6)
        if fencing < now then fencing = now else fencing = fencing + 1 end
        call('PSETEX', key, lease, head .. pack('>I8', fencing) .. rest)
        reply = fencing
      end
    end
    out[i] = reply
  end
end
return out
