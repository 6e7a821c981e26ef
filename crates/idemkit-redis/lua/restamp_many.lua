-- restamp_many: the fencing tokens of reservations a plain begin wrote with a stamp the
-- server's clock did not prove (src/stamp.rs, ARCHITECTURE row R13), taken again from the
-- clock, for several keys of one slot in one call (a batch's stale keys share their stamp).
-- KEYS      the record keys
-- ARGV[1]   the stale stamp (8 bytes, big-endian)
-- ARGV[1+i] key i's owner token (16 bytes)
-- Returns one integer per key, in KEYS order: the new token, or 0 when the key does not hold
-- that owner's reservation under the stale stamp (the client then sends begin_many.lua for
-- it, which answers whatever the key holds). The new token is the clock's now: the stamp was
-- never handed to anyone, and a token must not be pushed past the clock, or a later stamp
-- could fall under it.
local stale = ARGV[1]
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local packed = struct.pack('>I8', now)
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  out[i] = 0
  if v and #v >= 46 and string.sub(v, 1, 3) == 'IDK' and string.byte(v, 5) == 1
      and string.sub(v, 7, 30) == ARGV[1 + i] .. stale then
    redis.call('SETRANGE', KEYS[i], 22, packed)
    out[i] = now
  end
end
return out
