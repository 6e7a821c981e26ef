-- release: delete the caller's live reservation and wake waiters.
-- KEYS[1] record key  ARGV[1] owner token (16 bytes)  ARGV[2] wake-up channel
-- ARGV[3] 'PUBLISH' or 'SPUBLISH'
-- Returns 1, or 0 when the caller no longer owns a live reservation (nothing changes).
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 5) ~= 'IDK\1\1' or string.sub(v, 7, 22) ~= ARGV[1] then
  return 0
end
-- Not a plain DEL: a one-second tombstone "IDK" 1 3 fencing keeps the fencing token, so a
-- reservation within the same microsecond still gets a larger one (begin.lua).
redis.call('SET', KEYS[1], 'IDK\1\3' .. string.sub(v, 23, 30), 'PX', 1000)
if string.byte(v, 6) >= 2 then
  redis.call(ARGV[3], ARGV[2], '')
end
return 1
