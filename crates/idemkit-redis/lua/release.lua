-- release: delete the caller's live reservation and wake waiters.
-- KEYS[1] record key  ARGV[1] owner token  ARGV[2] wake-up channel  ARGV[3] publish command
-- Returns 1, or 0 when the caller no longer owns a live reservation (nothing changes).
local v = owned_reservation(KEYS[1], ARGV[1])
if not v then
  return 0
end
-- Not a plain DEL: a one-second tombstone keeps the fencing token, so a reservation in the
-- same microsecond still gets a larger one.
redis.call('SET', KEYS[1], MAGIC .. '\3' .. string.sub(v, 23, 30), 'PX', 1000)
redis.call(ARGV[3], ARGV[2], '')
return 1
