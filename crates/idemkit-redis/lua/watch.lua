-- watch: before a waiter sleeps, check that the reservation it saw is still the live state,
-- and mark it "watched" so that its completion or release publishes a wake-up.
-- The waiter has already subscribed to the wake-up channel, so nothing published after this
-- script runs can be missed.
-- KEYS[1] record key  ARGV[1] the fencing token the waiter saw (8 bytes, big-endian)
-- Returns the reservation's remaining lease in ms, or -2 when it is no longer the live
-- state (completed, released, expired, taken over): then the waiter returns at once.
local v = redis.call('GET', KEYS[1])
local head = v and string.sub(v, 1, 5)
if not v or (head ~= 'IDK\1\1' and head ~= 'IDK\2\1') or string.sub(v, 23, 30) ~= ARGV[1] then
  return -2
end
local flags = string.byte(v, 6)
if flags < 2 then
  -- SETRANGE keeps the key's expiry (the lease).
  redis.call('SETRANGE', KEYS[1], 5, string.char(flags + 2))
end
return redis.call('PTTL', KEYS[1])
